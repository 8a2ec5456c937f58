"""A decoder layer's modules: RMSNorm, grouped-query attention with RoPE, the gated MLP, and the
pre-norm residual block (with a family's differences: stack.models.family).

Every parameter carries logical-axis sharding metadata, names among "vocab", "embed", "heads",
"kv_heads", "head_dim", "mlp", "norm". Module paths mirror HF: `attn/{q,k,v,o}_proj`,
`attn/{q,k}_norm`, `mlp/{gate,up,down}_proj`, `{attn,mlp}_norm` (and Gemma's `post_{attn,mlp}_norm`).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from stack.models.attention import platform_attention
from stack.models.attention_core import NEG, causal_attention, fold_queries, unfold_queries
from stack.models.family import Variant
from stack.models.moe import MoE
from stack.models.qkv import qkv
from stack.models.rope import apply_rope
from stack.models.shape import LlamaShape
from stack.models.swiglu import swiglu

Array = jax.Array
ACTIVATIONS = {"silu": jax.nn.silu, "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True)}


def linear(d_in: int, d_out: int, names: tuple[str, str], cfg: LlamaShape, rngs: nnx.Rngs,
           bias: bool = False) -> nnx.Linear:
    """A projection with a normal(init_std) kernel (and a zero bias) annotated with logical axes."""
    init = nnx.with_partitioning(nnx.initializers.normal(cfg.init_std), names)
    bias_init = nnx.with_partitioning(nnx.initializers.zeros_init(), names[1:])
    return nnx.Linear(d_in, d_out, use_bias=bias, kernel_init=init, bias_init=bias_init, dtype=jnp.dtype(cfg.dtype),
                      param_dtype=jnp.dtype(cfg.param_dtype), rngs=rngs)


class RMSNorm(nnx.Module):
    """Root-mean-square norm computed in float32, output cast to the compute dtype; `offset`:
    Gemma's, scaling by (1 + w) with w starting at 0."""

    def __init__(self, dim: int, eps: float, dtype: Any, param_dtype: Any, *, rngs: nnx.Rngs, offset: bool = False):
        init = nnx.with_partitioning(nnx.initializers.zeros_init() if offset else nnx.initializers.ones, ("norm",))
        self.weight = nnx.Param(init(rngs.params(), (dim,), param_dtype))
        self.eps, self.dtype, self.offset = eps, dtype, float(offset)

    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (x32 * (self.offset + self.weight[...].astype(jnp.float32))).astype(self.dtype)


def _norm(dim: int, cfg: LlamaShape, variant: Variant, rngs: nnx.Rngs) -> RMSNorm:
    return RMSNorm(dim, cfg.norm_eps, jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype), rngs=rngs,
                   offset=variant.gemma)


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE; K/V heads are shared by groups of Q heads. `fused`: the
    Q, K and V projections as one product with a hand-written backward (stack.models.qkv) and, in
    calls without a cache, stack.models.attention_core (hand-written backward, causal query blocks)
    instead of autodiff of the einsums below; `unfuse`d as the MLP is. Unfused, that core gained
    nothing, so it comes with the fused projections only. `window`: a sliding layer's (the platform
    kernels apply it; the masks the decoder builds already hold it)."""

    def __init__(self, cfg: LlamaShape, head_dim: int, variant: Variant, window: int | None, *, rngs: nnx.Rngs):
        d, h, kv = cfg.d_model, cfg.n_heads, cfg.n_kv_heads
        if h % kv:
            raise ValueError(f"n_kv_heads={kv} must divide n_heads={h}")
        self.n_heads, self.n_kv_heads, self.head_dim = h, kv, head_dim
        bias = variant.attention_bias
        self.q_proj = linear(d, h * head_dim, ("embed", "heads"), cfg, rngs, bias)
        self.k_proj = linear(d, kv * head_dim, ("embed", "kv_heads"), cfg, rngs, bias)
        self.v_proj = linear(d, kv * head_dim, ("embed", "kv_heads"), cfg, rngs, bias)
        self.o_proj = linear(h * head_dim, d, ("heads", "embed"), cfg, rngs)
        self.q_norm = _norm(head_dim, cfg, variant, rngs) if variant.qk_norm else None
        self.k_norm = _norm(head_dim, cfg, variant, rngs) if variant.qk_norm else None
        self.window, self.scale = window, variant.query_scale or 1 / math.sqrt(head_dim)
        self.fused = True
        self.kernel, self.block, self.interpret = "core", None, False  # set by use_attention

    def _project(self, x: Array) -> tuple[Array, Array, Array]:
        projections = (self.q_proj, self.k_proj, self.v_proj)
        if not self.fused:
            return tuple(p(x) for p in projections)
        dtype = self.q_proj.dtype
        out = qkv(x.astype(dtype), *(p.kernel[...].astype(dtype) for p in projections))
        return tuple(y + p.bias[...].astype(dtype) if p.use_bias else y for y, p in zip(out, projections, strict=True))

    def _heads(self, x: Array, rope: tuple[Array, Array]) -> tuple[Array, Array, Array]:
        """q [B, T, H, hd] and k [B, T, kv, hd] normed (qk_norm) and rotated, v [B, T, kv, hd]."""
        b, t, _ = x.shape
        q, k, v = self._project(x)
        q, k = q.reshape(b, t, self.n_heads, self.head_dim), k.reshape(b, t, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, rope), apply_rope(k, rope), v.reshape(b, t, self.n_kv_heads, self.head_dim)

    def __call__(self, x: Array, rope: tuple[Array, Array], mask: Array,
                 cache: Optional[Any] = None) -> Any:
        """x [B, T, D], rope: `rope_tables` of the positions [B, T], mask bool [B, T, S] (True = may attend),
        or int segment ids [B, T] for the platform kernel (stack.models.attention; causal within a segment).

        With `cache` (a layer's writer, stack.models.kv_cache): this call's keys and values are written
        to it and attention runs over the S slots it returns; returns (out, the layer's new cache state).
        """
        b, t, _ = x.shape
        kv, g = self.n_kv_heads, self.n_heads // self.n_kv_heads
        q, k, v = self._heads(x, rope)
        if mask.ndim == 2:  # segment ids: the decoder chose the platform kernel
            out = platform_attention(self.kernel, q, k, v, mask, self.block, self.interpret, self.window, self.scale)
            return self.o_proj(out.reshape(b, t, -1))
        if self.fused and cache is None:
            return self.o_proj(causal_attention(q, k, v, mask, self.scale))
        if cache is not None:
            k, v, state = cache.write(k, v)
        # a kv head's g query heads folded into the query axis: both products are batched matmuls
        scores = jnp.einsum("bkqd,bskd->bkqs", fold_queries(q, kv), k, preferred_element_type=jnp.float32)
        scores = jnp.where(jnp.tile(mask, (1, g, 1))[:, None], scores * self.scale, NEG)
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = self.o_proj(unfold_queries(jnp.einsum("bkqs,bskd->bkqd", probs, v), t))
        return out if cache is None else (out, state)


class MLP(nnx.Module):
    """Gated feed-forward: down(act(gate(x)) * up(x)), act SiLU (SwiGLU) or Gemma's tanh GELU. `fused`
    (SiLU only): stack.models.swiglu, gate and up one product of the kernels stacked at call time,
    [D, 2, F] (params keep HF's layout), with a hand-written backward, faster on CPU than unfused.
    `unfuse`d for Qwix (it intercepts each projection's call) and off CPU
    (stack.checkpoint.policy.initial_model: fused, Llama 3 8B SFT on TPU compiled to more memory per chip)."""

    def __init__(self, cfg: LlamaShape, act: str = "silu", *, rngs: nnx.Rngs):
        self.gate_proj = linear(cfg.d_model, cfg.d_ff, ("embed", "mlp"), cfg, rngs)
        self.up_proj = linear(cfg.d_model, cfg.d_ff, ("embed", "mlp"), cfg, rngs)
        self.down_proj = linear(cfg.d_ff, cfg.d_model, ("mlp", "embed"), cfg, rngs)
        self.act, self.fused = act, True

    def __call__(self, x: Array) -> Array:
        if not self.fused or self.act != "silu":
            return self.down_proj(ACTIVATIONS[self.act](self.gate_proj(x)) * self.up_proj(x))
        dtype = self.gate_proj.dtype
        kernels = (p.kernel[...].astype(dtype) for p in (self.gate_proj, self.up_proj, self.down_proj))
        return swiglu(x.astype(dtype), *kernels)


class Block(nnx.Module):
    """Pre-norm residual decoder block: x + attn(norm(x)), then + mlp(norm(.)) (or routed experts:
    stack.models.moe); Gemma's norms the outputs of both too (`post_attn_norm`, `post_mlp_norm`).
    A sliding layer reads the second of the (full, sliding) RoPE tables and masks it is given."""

    def __init__(self, cfg: LlamaShape, head_dim: int, variant: Variant, window: int | None, *, rngs: nnx.Rngs):
        self.sliding = int(window is not None)
        self.attn_norm = _norm(cfg.d_model, cfg, variant, rngs)
        self.attn = Attention(cfg, head_dim, variant, window, rngs=rngs)
        self.post_attn_norm = _norm(cfg.d_model, cfg, variant, rngs) if variant.gemma else None
        self.mlp_norm = _norm(cfg.d_model, cfg, variant, rngs)
        self.mlp = (MoE(cfg, variant.experts, variant.top_k, variant.expert_ff, variant.norm_topk, rngs=rngs)
                    if variant.experts else MLP(cfg, variant.act, rngs=rngs))
        self.post_mlp_norm = _norm(cfg.d_model, cfg, variant, rngs) if variant.gemma else None

    def __call__(self, x: Array, ropes: tuple, masks: tuple, real: Optional[Array] = None,
                 cache: Optional[Any] = None) -> Any:
        """`real` [B, T]: the tokens an MoE layer's balance counts (None: all)."""
        rope, mask = ropes[self.sliding], masks[self.sliding]
        h = self.attn(self.attn_norm(x), rope, mask, cache)
        h, kv = (h, None) if cache is None else h
        x = x + (h if self.post_attn_norm is None else self.post_attn_norm(h))
        h = self.mlp(self.mlp_norm(x), real) if isinstance(self.mlp, MoE) else self.mlp(self.mlp_norm(x))
        x = x + (h if self.post_mlp_norm is None else self.post_mlp_norm(h))
        return x if cache is None else (x, kv)
