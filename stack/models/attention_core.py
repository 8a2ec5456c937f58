"""The causal attention core, softmax(Q K^T / sqrt(d) + mask) V, with a hand-written backward and
causal query blocks: the core of a self-attention call over a whole sequence (training, scoring).

Forward as HF LlamaAttention's eager path: masked scores set to float32's min, the query heads
of a kv head folded into the query axis ([B, kv, g*T, hd]) so that both products are batched
matmuls, the 1/sqrt(hd) folded into the queries (the same bits for hd = 64; rounding otherwise).

Backward: FlashAttention's (Dao et al. 2022, "FlashAttention", Algorithm 4) from the saved
probabilities P: dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO O)), dQ = dS K, dK = dS^T Q.
Masked scores have P = 0, so dS needs no mask: this needs every query to see at least one key
(Llama.hidden's masks let each token see itself); a fully masked row would pass gradient to
its keys, where autodiff of the masked scores passes none.

Causal query blocks: the T queries are cut into n blocks and block i is scored against keys
[0, (i+1)T/n) only, the keys the causal mask leaves to some of its queries: (n+1)/2n of the
score work. Exact up to summation order, for masks within the causal one.

On 2 CPU cores (8 x 256 tokens, 8 query and 4 kv heads of 64, fp32), a layer's core forward +
backward, min of 15 interleaved in one process: 24.8 ms by autodiff, 25.5 ms with this backward
alone, 21.4 ms in 4 blocks by autodiff, 13.4 ms in 4 blocks with this backward (8 blocks: 11.9).
In the whole medium training step (d_model 512, 4 layers; in-process A/B against the autodiff
core, alternating runs, min / median): 4 blocks 0.940 / 0.948 and 0.948 / 0.956, 8 blocks
0.957 / 0.957 and 0.952 / 0.967, this backward alone 0.967 / 0.956, 4 blocks by autodiff 1.004.
Per T (2,048 tokens), the core's min ms by autodiff / with this backward in 1, 2, 4, 8 blocks:
T 64: 6.5 / 6.6, 4.7; T 128: 10.9 / 11.3, 8.6, 7.2, 7.7; T 512: 58.9 / 52.8, 38.4, 31.2, 26.9
(16: 33.4); T 1024: 121 / 113, 78, 57, 55 (16: 56). Hence at most 8 blocks, of at least 64 queries:
whole steps ran as fast with those as with 32 (above; the tiny step, T 64: 0.978 / 0.993 of autodiff's
in 1 block, 0.983 / 0.986 in 2), and a program with fewer blocks compiles sooner.
"""

import math

import jax
import jax.numpy as jnp

Array = jax.Array
NEG = jnp.finfo(jnp.float32).min  # a masked score (as the autodiff core and HF's eager attention)
MIN_BLOCK_QUERIES, MAX_BLOCKS = 64, 8


def query_blocks(t: int) -> int:
    """The causal query blocks for T queries: the most of 8, 4, 2 that cut T into equal blocks of
    at least 64 queries, else 1."""
    return next((n for n in (MAX_BLOCKS, 4, 2) if t % n == 0 and t // n >= MIN_BLOCK_QUERIES), 1)


def _probs(q: Array, k: Array, mask: Array) -> Array:
    scores = jnp.where(mask, jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32), NEG)
    return jax.nn.softmax(scores, axis=-1)


@jax.custom_vjp
def _core(q: Array, k: Array, v: Array, mask: Array) -> Array:
    """q [B, kv, R, hd] (scaled), k and v [B, kv, S, hd], mask bool [B, 1, R, S] -> [B, kv, R, hd]."""
    return _core_fwd(q, k, v, mask)[0]


def _core_fwd(q: Array, k: Array, v: Array, mask: Array) -> tuple[Array, tuple]:
    p = _probs(q, k, mask).astype(v.dtype)
    out = jnp.einsum("bkqs,bksd->bkqd", p, v)
    return out, (q, k, v, p, out)


def _core_bwd(res: tuple, d_out: Array) -> tuple[Array, Array, Array, None]:
    q, k, v, p, out = res
    d_v = jnp.einsum("bkqs,bkqd->bksd", p, d_out)
    d_p = jnp.einsum("bkqd,bksd->bkqs", d_out, v, preferred_element_type=jnp.float32)
    row = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
    d_s = (p.astype(jnp.float32) * (d_p - row)).astype(q.dtype)
    d_q = jnp.einsum("bkqs,bksd->bkqd", d_s, k)
    d_k = jnp.einsum("bkqs,bkqd->bksd", d_s, q)
    return d_q, d_k, d_v, None


_core.defvjp(_core_fwd, _core_bwd)


def fold_queries(q: Array, kv: int) -> Array:
    """[B, T, kv*g, hd] -> [B, kv, g*T, hd]: query head h is kv head h // g's (as HF repeat_kv)."""
    b, t, h, hd = q.shape
    return q.reshape(b, t, kv, h // kv, hd).transpose(0, 2, 3, 1, 4).reshape(b, kv, h // kv * t, hd)


def unfold_queries(out: Array, t: int) -> Array:
    """[B, kv, g*T, hd] -> [B, T, kv*g*hd]."""
    b, kv, _, hd = out.shape
    return out.reshape(b, kv, -1, t, hd).transpose(0, 3, 1, 2, 4).reshape(b, t, -1)


def causal_attention(q: Array, k: Array, v: Array, mask: Array) -> Array:
    """q [B, T, H, hd] (RoPE applied), k and v [B, T, kv, hd], mask bool [B, T, T] (True = may attend;
    within the causal mask, each query seeing its own position) -> [B, T, H*hd]."""
    t, h, hd = q.shape[1:]
    kv = k.shape[2]
    rows = t // query_blocks(t)
    q = q * (1 / math.sqrt(hd))
    outs = []
    for end in range(rows, t + 1, rows):  # block [end - rows, end) against keys [0, end)
        queries = slice(end - rows, end)
        block_mask = jnp.tile(mask[:, queries, :end], (1, h // kv, 1))[:, None]
        heads = (x[:, :end].transpose(0, 2, 1, 3) for x in (k, v))
        outs.append(unfold_queries(_core(fold_queries(q[:, queries], kv), *heads, block_mask), rows))
    return jnp.concatenate(outs, axis=1)
