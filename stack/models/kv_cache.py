"""The generation cache of a Llama: every layer's keys and values in fixed slots
(`Llama.__call__(..., cache=KVCache)` writes a call's tokens at `index`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp

if TYPE_CHECKING:
    from stack.models.llama import Llama


class KVCache(NamedTuple):
    """Keys and values of every layer in fixed slots, for generation (a pytree)."""

    k: tuple[jax.Array, ...]  # per layer [B, S, kv_heads, head_dim]
    v: tuple[jax.Array, ...]
    valid: jax.Array  # [B, S] bool: slots that hold a real token
    index: jax.Array  # int32: the next slot to write


def init_cache(model: Llama, batch: int, length: int) -> KVCache:
    """An empty cache of `length` slots for `batch` rows, in the model's compute dtype."""
    attn = model.layers[0].attn
    shape = (batch, length, attn.n_kv_heads, attn.head_dim)
    zeros = tuple(jnp.zeros(shape, model.dtype) for _ in model.layers)
    return KVCache(zeros, tuple(jnp.zeros(shape, model.dtype) for _ in model.layers),
                   jnp.zeros((batch, length), bool), jnp.zeros((), jnp.int32))
