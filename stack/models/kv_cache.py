"""The generation caches of the decoder: every layer's keys and values, in one of two layouts.

- `KVCache` (the static engine): per layer [B, S, kv, hd] slots; a call writes its tokens at the
  shared `index`, and a query sees the valid slots up to its own.
- `PagedKV` (the paged engine, stack.rollout.paged): per layer a pool of fixed-size pages
  [pages, page_size, kv, hd] and a page table per row; a token at position p lives in page
  table[row, p // page_size] at offset p % page_size, so a row's slots are its positions and a query
  sees the slots up to its own position. Page 0 is scratch: padding and idle rows write there.
  Attention gathers a row's pages into [B, S, kv, hd] (S = table width x page size).

`Llama.__call__(..., cache=...)` takes either: `visible` gives the mask, `layer(i, ...)` the writer of
layer i, whose `write(k, v)` returns the keys and values to attend over and the layer's new state;
`updated` assembles the new cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp

if TYPE_CHECKING:
    from stack.models.llama import Llama

Array = jax.Array


class SlotWrite(NamedTuple):
    """One layer's static slots and the index a call writes at."""

    k: Array
    v: Array
    index: Array

    def write(self, k: Array, v: Array) -> tuple[Array, Array, tuple[Array, Array]]:
        k = jax.lax.dynamic_update_slice(self.k, k.astype(self.k.dtype), (0, self.index, 0, 0))
        v = jax.lax.dynamic_update_slice(self.v, v.astype(self.v.dtype), (0, self.index, 0, 0))
        return k, v, (k, v)


class KVCache(NamedTuple):
    """Keys and values of every layer in fixed slots, for generation (a pytree)."""

    k: tuple[Array, ...]  # per layer [B, S, kv_heads, head_dim]
    v: tuple[Array, ...]
    valid: Array  # [B, S] bool: slots that hold a real token
    index: Array  # int32: the next slot to write

    def visible(self, positions: Array, real: Array) -> tuple[Array, Array, Array]:
        """(mask [B, T, S], query slots [1, T], key slots [S]) of a call of T tokens."""
        valid = jax.lax.dynamic_update_slice(self.valid, real, (0, self.index))
        slots, queries = jnp.arange(valid.shape[1]), self.index + jnp.arange(real.shape[1])
        return valid[:, None, :] & (slots[None, None, :] <= queries[None, :, None]), queries[None], slots

    def layer(self, i: int, positions: Array, real: Array) -> SlotWrite:
        return SlotWrite(self.k[i], self.v[i], self.index)

    def updated(self, states: list, real: Array) -> KVCache:
        valid = jax.lax.dynamic_update_slice(self.valid, real, (0, self.index))
        k, v = zip(*states, strict=True)
        return KVCache(tuple(k), tuple(v), valid, self.index + real.shape[1])


def init_cache(model: Llama, batch: int, length: int) -> KVCache:
    """An empty cache of `length` slots for `batch` rows, in the model's compute dtype."""
    shape = (batch, length, *_head_shape(model))
    return KVCache(*_zeros(model, shape), jnp.zeros((batch, length), bool), jnp.zeros((), jnp.int32))


class PageWrite(NamedTuple):
    """One layer's page pools, where this call's tokens go, and the rows' page tables."""

    k: Array  # [pages, page_size, kv, hd]
    v: Array
    pages: Array  # [B, T] the page of each new token (0: scratch)
    offsets: Array  # [B, T]
    table: Array  # [B, W]

    def write(self, k: Array, v: Array) -> tuple[Array, Array, tuple[Array, Array]]:
        pools = tuple(p.at[self.pages, self.offsets].set(x.astype(p.dtype)) for p, x in ((self.k, k), (self.v, v)))
        b, w = self.table.shape
        rows = tuple(p[self.table].reshape(b, w * p.shape[1], *p.shape[2:]) for p in pools)
        return rows[0], rows[1], pools


class PagedKV(NamedTuple):
    """Keys and values in page pools shared by every row, and each row's page table (a pytree)."""

    k: tuple[Array, ...]  # per layer [pages, page_size, kv_heads, head_dim]; page 0: scratch
    v: tuple[Array, ...]
    table: Array  # [B, W] int32: row b's position p is in page table[b, p // page_size]

    def visible(self, positions: Array, real: Array) -> tuple[Array, Array, Array]:
        """(mask [B, T, S], query slots [B, T], key slots [S]): a real query sees the slots up to its position."""
        slots = jnp.arange(self.table.shape[1] * self.k[0].shape[1])
        mask = (slots[None, None, :] <= positions[:, :, None]) & real[:, :, None]
        return mask, positions, slots

    def layer(self, i: int, positions: Array, real: Array) -> PageWrite:
        size = self.k[0].shape[1]
        page = jnp.take_along_axis(self.table, positions // size, axis=1)
        return PageWrite(self.k[i], self.v[i], jnp.where(real, page, 0), positions % size, self.table)

    def updated(self, states: list, real: Array) -> PagedKV:
        k, v = zip(*states, strict=True)
        return self._replace(k=tuple(k), v=tuple(v))


def init_paged(model: Llama, rows: int, pages: int, page_size: int, width: int) -> PagedKV:
    """Empty pools of `pages` pages (page 0 scratch) and `rows` page tables of `width` pages."""
    k, v = _zeros(model, (pages, page_size, *_head_shape(model)))
    return PagedKV(k, v, jnp.zeros((rows, width), jnp.int32))


def _head_shape(model: Llama) -> tuple[int, int]:
    attn = model.layers[0].attn
    return attn.n_kv_heads, attn.head_dim


def _zeros(model: Llama, shape: tuple[int, ...]) -> tuple[tuple[Array, ...], tuple[Array, ...]]:
    return tuple(tuple(jnp.zeros(shape, model.dtype) for _ in model.layers) for _ in range(2))
