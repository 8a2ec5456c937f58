"""Llama-family decoder (Llama 2/3, GQA, SwiGLU, RoPE with optional llama3 scaling) in Flax NNX.

Every parameter carries logical-axis sharding metadata (`out_sharding`), names among "vocab",
"embed", "heads", "kv_heads", "head_dim", "mlp", "norm". Module paths mirror HF: `embed`,
`layers/<i>/attn/{q,k,v,o}_proj`, `layers/<i>/mlp/{gate,up,down}_proj`, `layers/<i>/{attn,mlp}_norm`,
`norm`, `lm_head` (absent when embeddings are tied). Training memory: `model.remat` (`full`, `dots`)
wraps each decoder layer in `nnx.remat` (the backward recomputes it; `dots` keeps matmul outputs);
`model.scan_layers` runs the layers as one `jax.lax.scan` (stack.models.layer_stack).

Generation: `model(tokens, positions, segment_ids, cache=KVCache)` writes the new tokens' keys and values
into the cache's slots, attends over each query's valid slots, returns (logits, cache); stack.models.kv_cache.

Building (initialised or shape-only, sharded at creation under a mesh): stack.models.init.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stack.models.attention import KERNELS, applies, platform_attention
from stack.models.attention_core import NEG, causal_attention, fold_queries, unfold_queries
from stack.models.kv_cache import KVCache
from stack.models.layer_stack import run_layers
from stack.models.qkv import qkv
from stack.models.rope import apply_rope, rope_inv_freq, rope_tables
from stack.models.shape import LlamaShape
from stack.models.swiglu import swiglu

Array = jax.Array


def _linear(d_in: int, d_out: int, names: tuple[str, str], cfg: LlamaShape, rngs: nnx.Rngs) -> nnx.Linear:
    """Bias-free projection with a normal(init_std) kernel annotated with logical axes."""
    init = nnx.with_partitioning(nnx.initializers.normal(cfg.init_std), names)
    return nnx.Linear(d_in, d_out, use_bias=False, kernel_init=init, dtype=jnp.dtype(cfg.dtype),
                      param_dtype=jnp.dtype(cfg.param_dtype), rngs=rngs)


class RMSNorm(nnx.Module):
    """Root-mean-square norm computed in float32, output cast to the compute dtype."""

    def __init__(self, dim: int, eps: float, dtype: Any, param_dtype: Any, *, rngs: nnx.Rngs):
        init = nnx.with_partitioning(nnx.initializers.ones, ("norm",))
        self.weight = nnx.Param(init(rngs.params(), (dim,), param_dtype))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (x32 * self.weight[...].astype(jnp.float32)).astype(self.dtype)


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE; K/V heads are shared by groups of Q heads. `fused`: the
    Q, K and V projections as one product with a hand-written backward (stack.models.qkv) and, in
    calls without a cache, stack.models.attention_core (hand-written backward, causal query blocks)
    instead of autodiff of the einsums below; `unfuse`d as the MLP is. Unfused, that core gained
    nothing, so it comes with the fused projections only."""

    def __init__(self, cfg: LlamaShape, head_dim: int, *, rngs: nnx.Rngs):
        d, h, kv = cfg.d_model, cfg.n_heads, cfg.n_kv_heads
        if h % kv:
            raise ValueError(f"n_kv_heads={kv} must divide n_heads={h}")
        self.n_heads, self.n_kv_heads, self.head_dim = h, kv, head_dim
        self.q_proj = _linear(d, h * head_dim, ("embed", "heads"), cfg, rngs)
        self.k_proj = _linear(d, kv * head_dim, ("embed", "kv_heads"), cfg, rngs)
        self.v_proj = _linear(d, kv * head_dim, ("embed", "kv_heads"), cfg, rngs)
        self.o_proj = _linear(h * head_dim, d, ("heads", "embed"), cfg, rngs)
        self.fused = True
        self.kernel, self.block, self.interpret = "core", None, False  # set by use_attention

    def _project(self, x: Array) -> tuple[Array, Array, Array]:
        projections = (self.q_proj, self.k_proj, self.v_proj)
        if not self.fused:
            return tuple(p(x) for p in projections)
        dtype = self.q_proj.dtype
        return qkv(x.astype(dtype), *(p.kernel[...].astype(dtype) for p in projections))

    def __call__(self, x: Array, rope: tuple[Array, Array], mask: Array,
                 cache: Optional[tuple[Array, Array, Array]] = None) -> Any:
        """x [B, T, D], rope: `rope_tables` of the positions [B, T], mask bool [B, T, S] (True = may attend),
        or int segment ids [B, T] for the platform kernel (stack.models.attention; causal within a segment).

        With `cache` = (keys [B, S, kv, hd], values, write index): this call's keys and values
        are written at the index and attention runs over all S slots; returns (out, (keys, values)).
        """
        b, t, _ = x.shape
        kv, g, hd = self.n_kv_heads, self.n_heads // self.n_kv_heads, self.head_dim
        q, k, v = self._project(x)
        q = apply_rope(q.reshape(b, t, kv * g, hd), rope)
        k = apply_rope(k.reshape(b, t, kv, hd), rope)
        v = v.reshape(b, t, kv, hd)
        if mask.ndim == 2:  # segment ids: Llama.hidden chose the platform kernel
            out = platform_attention(self.kernel, q, k, v, mask, self.block, self.interpret)
            return self.o_proj(out.reshape(b, t, kv * g * hd))
        if self.fused and cache is None:
            return self.o_proj(causal_attention(q, k, v, mask))
        if cache is not None:
            k = jax.lax.dynamic_update_slice(cache[0], k.astype(cache[0].dtype), (0, cache[2], 0, 0))
            v = jax.lax.dynamic_update_slice(cache[1], v.astype(cache[1].dtype), (0, cache[2], 0, 0))
        # a kv head's g query heads folded into the query axis: both products are batched matmuls
        scores = jnp.einsum("bkqd,bskd->bkqs", fold_queries(q, kv), k, preferred_element_type=jnp.float32)
        scores = jnp.where(jnp.tile(mask, (1, g, 1))[:, None], scores / math.sqrt(hd), NEG)
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = self.o_proj(unfold_queries(jnp.einsum("bkqs,bskd->bkqd", probs, v), t))
        return out if cache is None else (out, (k, v))


class MLP(nnx.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)). `fused`: stack.models.swiglu, gate and up one
    product of the kernels stacked at call time, [D, 2, F] (params keep HF's layout), with a hand-written
    backward, faster on CPU than unfused. `unfuse`d for Qwix (it intercepts each projection's call) and
    off CPU (stack.checkpoint.policy.initial_model: fused, Llama 3 8B SFT on TPU compiled to more memory
    per chip)."""

    def __init__(self, cfg: LlamaShape, *, rngs: nnx.Rngs):
        self.gate_proj = _linear(cfg.d_model, cfg.d_ff, ("embed", "mlp"), cfg, rngs)
        self.up_proj = _linear(cfg.d_model, cfg.d_ff, ("embed", "mlp"), cfg, rngs)
        self.down_proj = _linear(cfg.d_ff, cfg.d_model, ("mlp", "embed"), cfg, rngs)
        self.fused = True

    def __call__(self, x: Array) -> Array:
        if not self.fused:
            return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))
        dtype = self.gate_proj.dtype
        kernels = (p.kernel[...].astype(dtype) for p in (self.gate_proj, self.up_proj, self.down_proj))
        return swiglu(x.astype(dtype), *kernels)


def use_attention(model: nnx.Module, kernel: str, block: Optional[int] = None, interpret: bool = False) -> nnx.Module:
    """`model` computing whole-sequence attention with `kernel` (stack.models.attention.KERNELS; `block`:
    splash's block, None: chosen by T; `interpret`: Pallas interpret mode, for tests on CPU). Where the
    kernel does not apply (a T splash cannot block, DPO's shared prompts) the core computes it."""
    if kernel not in KERNELS:
        raise ValueError(f"attention kernel {kernel!r}: one of {', '.join(KERNELS)}")
    for module in (m for _, m in nnx.iter_modules(model)):
        if isinstance(module, Attention):
            module.kernel, module.block, module.interpret = kernel, block, interpret
        elif isinstance(module, Llama):
            module.attention, module.attention_block = kernel, block
    return model


def unfuse(model: nnx.Module) -> nnx.Module:
    """`model` with every MLP computing gate and up, and every attention Q, K and V, by their own
    projections (for Qwix), and the attention core by autodiff."""
    for module in (m for _, m in nnx.iter_modules(model) if isinstance(m, (MLP, Attention))):
        module.fused = False
    return model


class Block(nnx.Module):
    """Pre-norm residual decoder block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, cfg: LlamaShape, head_dim: int, *, rngs: nnx.Rngs):
        dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, dtype, pdtype, rngs=rngs)
        self.attn = Attention(cfg, head_dim, rngs=rngs)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps, dtype, pdtype, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x: Array, rope: tuple[Array, Array], mask: Array,
                 cache: Optional[tuple[Array, Array, Array]] = None) -> Any:
        if cache is None:
            x = x + self.attn(self.attn_norm(x), rope, mask)
            return x + self.mlp(self.mlp_norm(x))
        h, kv = self.attn(self.attn_norm(x), rope, mask, cache)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), kv


def head_dim_of(cfg: LlamaShape) -> int:
    """The attention head size: `head_dim`, or d_model / n_heads when unset."""
    return cfg.head_dim or cfg.d_model // cfg.n_heads


class Llama(nnx.Module):
    """Llama decoder: tokens [B, T] int32 -> float32 logits [B, T, vocab_size]."""

    def __init__(self, cfg: LlamaShape, *, rngs: nnx.Rngs, layers: Optional[Callable[[nnx.Rngs], list]] = None):
        dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        head_dim = head_dim_of(cfg)
        if head_dim % 2:
            raise ValueError(f"head_dim={head_dim} must be even for RoPE")
        self.dtype = dtype
        self.tie_embeddings = bool(cfg.tie_embeddings)
        self.remat = str(getattr(cfg, "remat", "none"))
        self.scan_layers = bool(getattr(cfg, "scan_layers", False))
        self.attention, self.attention_block = "core", None  # set by use_attention
        # static (hashable) RoPE table; the config itself is not stored (it is unhashable)
        self.inv_freq = tuple(rope_inv_freq(head_dim, cfg.rope_theta, cfg.rope_scaling).tolist())
        embed_init = nnx.with_partitioning(nnx.initializers.normal(cfg.init_std), ("vocab", "embed"))
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=dtype, param_dtype=pdtype,
                               embedding_init=embed_init, rngs=rngs)
        make = layers or (lambda r: [Block(cfg, head_dim, rngs=r) for _ in range(cfg.n_layers)])
        self.layers = nnx.List(make(rngs))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps, dtype, pdtype, rngs=rngs)
        if not self.tie_embeddings:
            self.lm_head = _linear(cfg.d_model, cfg.vocab_size, ("embed", "vocab"), cfg, rngs)

    def __call__(self, tokens: Array, positions: Optional[Array] = None, segment_ids: Optional[Array] = None,
                 cache: Optional[KVCache] = None, targets: Optional[Array] = None, temperature: float = 1.0,
                 chunk: int = 128, features: bool = False, at: Optional[Array] = None,
                 parent_ids: Optional[Array] = None) -> Any:
        """Causal forward; with segment_ids a token sees only earlier-or-equal same-id tokens.

        With `cache`: (logits, updated cache); `segment_ids` > 0 marks this call's real tokens.
        With `targets` [B, N]: (log-probs [B, N], entropies [B, N]) of the targets under the
        distributions (logits / temperature) at the last N positions, computed `chunk`
        positions at a time (never a whole [B, N, vocab] array; recomputed in the backward);
        `at` [B, N]: the positions scored instead of the last N (the head runs only there).
        `parent_ids`: a token also sees earlier tokens whose segment id is its parent id.
        `features`: the final-normed hidden states [B, T, d_model] instead of logits (what a
        scalar head reads, as HF's LlamaForSequenceClassification); with `targets`, returned
        third at those N positions. Everything goes through `__call__` (Qwix intercepts it).
        """
        if cache is not None:
            return self._cached(tokens, positions, segment_ids, cache)
        x = self.hidden(tokens, positions, segment_ids, parent_ids)
        if targets is None:
            return self.norm(x) if features else self.head(x)
        x = x[:, x.shape[1] - targets.shape[1]:] if at is None else jnp.take_along_axis(x, at[..., None], axis=1)
        scored = self._score(x, targets, temperature, chunk)
        return (*scored, self.norm(x)) if features else scored

    def _score(self, x: Array, targets: Array, temperature: float, chunk: int) -> tuple[Array, Array]:
        b, n = targets.shape
        size = min(chunk, n)
        pad = -n % size
        xs = jnp.pad(x, ((0, 0), (0, pad), (0, 0))).reshape(b, -1, size, x.shape[-1]).swapaxes(0, 1)
        ts = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, -1, size).swapaxes(0, 1)

        @jax.checkpoint
        def one(part: tuple[Array, Array]) -> tuple[Array, Array]:
            logp = jax.nn.log_softmax(self.head(part[0]) / temperature, axis=-1)
            chosen = jnp.take_along_axis(logp, part[1][..., None], axis=-1)[..., 0]
            return chosen, -(jnp.exp(logp) * logp).sum(-1)

        logps, entropy = jax.lax.map(one, (xs, ts))
        return tuple(a.swapaxes(0, 1).reshape(b, -1)[:, :n] for a in (logps, entropy))

    def hidden(self, tokens: Array, positions: Optional[Array] = None, segment_ids: Optional[Array] = None,
               parent_ids: Optional[Array] = None) -> Array:
        """The final hidden states [B, T, d_model] (before the last norm): `head` turns them into logits.
        A position is at most its token's index in the row (RoPE reads a table of positions 0..T-1)."""
        b, t = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        if parent_ids is None and applies(self.attention, t, self.attention_block):  # no [T, T] mask
            segments = jnp.ones((b, t), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
            args = (rope_tables(positions, np.asarray(self.inv_freq, np.float32), rows=t), segments)
            return run_layers(self.layers, self.embed(tokens), args, self.remat, self.scan_layers)
        mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), dtype=bool)), (b, t, t))
        if segment_ids is not None:
            same = segment_ids[:, :, None] == segment_ids[:, None, :]
            if parent_ids is not None:
                same = same | (parent_ids[:, :, None] == segment_ids[:, None, :])
            mask = mask & same
        args = (rope_tables(positions, np.asarray(self.inv_freq, np.float32), rows=t), mask)  # positions < t
        return run_layers(self.layers, self.embed(tokens), args, self.remat, self.scan_layers)

    def head(self, x: Array) -> Array:
        """Float32 logits of hidden states (final norm, then the output projection)."""
        x = self.norm(x)
        logits = self.embed.attend(x) if self.tie_embeddings else self.lm_head(x)
        return logits.astype(jnp.float32)

    def _cached(self, tokens: Array, positions: Array, segment_ids: Optional[Array],
                cache: KVCache) -> tuple[Array, KVCache]:
        """The new tokens written at the cache's index; each query sees the valid slots up to its own."""
        b, t = tokens.shape
        real = jnp.ones((b, t), bool) if segment_ids is None else segment_ids > 0
        valid = jax.lax.dynamic_update_slice(cache.valid, real, (0, cache.index))
        slots, queries = jnp.arange(valid.shape[1]), cache.index + jnp.arange(t)
        mask = valid[:, None, :] & (slots[None, None, :] <= queries[None, :, None])
        rope = rope_tables(positions, np.asarray(self.inv_freq, np.float32))
        x, keys, values = self.embed(tokens), [], []
        for layer, k, v in zip(self.layers, cache.k, cache.v, strict=True):
            x, (k, v) = layer(x, rope, mask, (k, v, cache.index))
            keys.append(k)
            values.append(v)
        return self.head(x), KVCache(tuple(keys), tuple(values), valid, cache.index + t)
