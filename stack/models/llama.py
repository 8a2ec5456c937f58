"""The decoder (Llama 2/3, and the families of stack.models.family: Qwen2/3, Mistral, Gemma 3) in
Flax NNX: GQA, a gated MLP, RoPE with optional llama3 or linear scaling; its layers in
stack.models.blocks.

Module paths mirror HF: `embed`, `layers/<i>/...` (stack.models.blocks), `norm`, `lm_head` (absent
when embeddings are tied). Training memory: `model.remat` (`full`, `dots`) wraps each decoder layer
in `nnx.remat` (the backward recomputes it; `dots` keeps matmul outputs); `model.scan_layers` runs
the layers as one `jax.lax.scan` (stack.models.layer_stack; layers of one kind only).

Generation: `model(tokens, positions, segment_ids, cache=KVCache | PagedKV)` writes the new tokens' keys and
values into the cache, attends over each query's visible slots, returns (logits, cache); stack.models.kv_cache.

Building (initialised or shape-only, sharded at creation under a mesh): stack.models.init.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stack.models.attention import KERNELS, applies
from stack.models.blocks import MLP, Attention, Block, RMSNorm, linear
from stack.models.family import variant_of
from stack.models.kv_cache import KVCache, PagedKV
from stack.models.layer_stack import run_layers
from stack.models.rope import rope_inv_freq, rope_tables
from stack.models.shape import LlamaShape

Array = jax.Array
Cache = KVCache | PagedKV


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


def head_dim_of(cfg: LlamaShape) -> int:
    """The attention head size: `head_dim`, or d_model / n_heads when unset."""
    return cfg.head_dim or cfg.d_model // cfg.n_heads


class Llama(nnx.Module):
    """The decoder: tokens [B, T] int32 -> float32 logits [B, T, vocab_size] (a family's, by its Variant)."""

    def __init__(self, cfg: LlamaShape, *, rngs: nnx.Rngs, layers: Optional[Callable[[nnx.Rngs], list]] = None):
        dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        head_dim = head_dim_of(cfg)
        if head_dim % 2:
            raise ValueError(f"head_dim={head_dim} must be even for RoPE")
        self.dtype, self.variant = dtype, variant_of(cfg)
        self.tie_embeddings = bool(cfg.tie_embeddings)
        self.remat = str(getattr(cfg, "remat", "none"))
        self.scan_layers = bool(getattr(cfg, "scan_layers", False))
        self.attention, self.attention_block = "core", None  # set by use_attention
        # static (hashable) RoPE tables of full and sliding layers; the config itself is not stored (it is unhashable)
        full = tuple(rope_inv_freq(head_dim, cfg.rope_theta, cfg.rope_scaling).tolist())
        local = self.variant.rope_local_theta
        self.inv_freqs = (full, full if local is None else tuple(rope_inv_freq(head_dim, local).tolist()))
        self.embed_scale = math.sqrt(cfg.d_model) if self.variant.gemma else None
        embed_init = nnx.with_partitioning(nnx.initializers.normal(cfg.init_std), ("vocab", "embed"))
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=dtype, param_dtype=pdtype,
                               embedding_init=embed_init, rngs=rngs)
        make = layers or (lambda r: [Block(cfg, head_dim, self.variant, self.variant.window(i), rngs=r)
                                     for i in range(cfg.n_layers)])
        self.layers = nnx.List(make(rngs))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps, dtype, pdtype, rngs=rngs, offset=self.variant.gemma)
        if not self.tie_embeddings:
            self.lm_head = linear(cfg.d_model, cfg.vocab_size, ("embed", "vocab"), cfg, rngs)

    def __call__(self, tokens: Array, positions: Optional[Array] = None, segment_ids: Optional[Array] = None,
                 cache: Optional[Cache] = None, targets: Optional[Array] = None, temperature: float = 1.0,
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
        ropes = self._ropes(positions, rows=t)  # positions < t
        if parent_ids is None and applies(self.attention, t, self.attention_block):  # no [T, T] mask
            segments = jnp.ones((b, t), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
            return run_layers(self.layers, self._embed(tokens), (ropes, (segments, segments), segments > 0),
                              self.remat, self.scan_layers)
        mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), dtype=bool)), (b, t, t))
        if segment_ids is not None:
            same = segment_ids[:, :, None] == segment_ids[:, None, :]
            if parent_ids is not None:
                same = same | (parent_ids[:, :, None] == segment_ids[:, None, :])
            mask = mask & same
        index = jnp.arange(t)
        masks = (mask, self._windowed(mask, index[None], index))
        real = None if segment_ids is None else segment_ids > 0
        return run_layers(self.layers, self._embed(tokens), (ropes, masks, real), self.remat, self.scan_layers)

    def _embed(self, tokens: Array) -> Array:
        """The token embeddings (Gemma's times sqrt(d_model), rounded to the params' dtype as transformers does)."""
        x = self.embed(tokens)
        if self.embed_scale is None:
            return x
        return x * jnp.asarray(self.embed_scale, self.embed.embedding.dtype).astype(x.dtype)

    def _ropes(self, positions: Array, rows: Optional[int] = None) -> tuple:
        """The (full, sliding) layers' RoPE tables of `positions` (one object when they are the same)."""
        full = rope_tables(positions, np.asarray(self.inv_freqs[0], np.float32), rows=rows)
        same = self.inv_freqs[1] == self.inv_freqs[0]
        return full, full if same else rope_tables(positions, np.asarray(self.inv_freqs[1], np.float32), rows=rows)

    def _windowed(self, mask: Array, queries: Array, keys: Array) -> Array:
        """`mask` [B, Tq, S] of a sliding layer (`queries` [B or 1, Tq]): a query also sees only keys with
        index > query − window (transformers' sliding_window_overlay); `mask` itself without sliding layers."""
        window = self.variant.sliding_window
        if window is None or not any(self.variant.sliding):
            return mask
        return mask & (queries[:, :, None] - keys[None, None, :] < window)

    def head(self, x: Array) -> Array:
        """Float32 logits of hidden states (final norm, then the output projection; Gemma's soft-capping)."""
        x = self.norm(x)
        logits = (self.embed.attend(x) if self.tie_embeddings else self.lm_head(x)).astype(jnp.float32)
        cap = self.variant.final_softcap
        return logits if cap is None else cap * jnp.tanh(logits / cap)

    def _cached(self, tokens: Array, positions: Array, segment_ids: Optional[Array],
                cache: Cache) -> tuple[Array, Cache]:
        """The new tokens written to the cache (stack.models.kv_cache); each query sees the cache's
        visible slots (a sliding layer's: those within its window)."""
        real = jnp.ones(tokens.shape, bool) if segment_ids is None else segment_ids > 0
        mask, queries, slots = cache.visible(positions, real)
        masks, ropes = (mask, self._windowed(mask, queries, slots)), self._ropes(positions)
        x, states = self._embed(tokens), []
        for i, layer in enumerate(self.layers):
            x, state = layer(x, ropes, masks, real, cache.layer(i, positions, real))
            states.append(state)
        return self.head(x), cache.updated(states, real)
