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

On CPU, blocks with this backward make the core markedly faster than autodiff's (blocks by
autodiff gain little). At most 8 blocks, of at least 64 queries: more ran no faster, and a
program with fewer blocks compiles sooner.
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


def causal_attention(q: Array, k: Array, v: Array, mask: Array, scale: float | None = None) -> Array:
    """q [B, T, H, hd] (RoPE applied), k and v [B, T, kv, hd], mask bool [B, T, T] (True = may attend;
    within the causal mask, each query seeing its own position) -> [B, T, H*hd]. The scores are
    scaled by `scale` (None: 1/sqrt(hd))."""
    t, h, hd = q.shape[1:]
    kv = k.shape[2]
    rows = t // query_blocks(t)
    q = q * (1 / math.sqrt(hd) if scale is None else scale)
    outs = []
    for end in range(rows, t + 1, rows):  # block [end - rows, end) against keys [0, end)
        queries = slice(end - rows, end)
        block_mask = jnp.tile(mask[:, queries, :end], (1, h // kv, 1))[:, None]
        heads = (x[:, :end].transpose(0, 2, 1, 3) for x in (k, v))
        outs.append(unfold_queries(_core(fold_queries(q[:, queries], kv), *heads, block_mask), rows))
    return jnp.concatenate(outs, axis=1)
