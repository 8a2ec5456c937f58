"""Continuous batching over a paged KV cache (`rollout.engine=paged`).

`slots` rows decode together. The B requests (left-padded prompts) wait in order; whenever a slot is
free and the pool holds the pages a request may need (ceil((prompt + max_new_tokens) / page_size),
taken when it is admitted, so an admitted row never waits for a page), the request's prompt is
prefilled into its pages and it joins the decoding rows. A row that ends (an EOS id or
max_new_tokens) returns its pages at once, and the next request takes its slot. Everything runs in
one `lax.while_loop` under `jit`; its shapes are two: the prefill [1, P] and the decode step
[slots, 1] (stack.models.kv_cache.PagedKV gathers each row's pages; page 0 is scratch for padding
and idle slots).

Samples equal the static engine's (stack.rollout.generate) for the same keys: request b's token t
is drawn with fold_in(keys[b], t), whatever slot or round it decodes in.
"""

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from stack.errors import ConfigError
from stack.models.kv_cache import PagedKV, init_paged
from stack.rollout.sampling import Sampling, sample_token

Array = jax.Array


@dataclass(frozen=True)
class Paging:
    """The paged engine's sizes (static: part of the compiled program)."""

    slots: int = 0  # rows decoded together; 0: every row of the batch
    page_size: int = 16
    pages: int = 0  # the pool, scratch included; 0: every slot's longest request, + 1


def paging_of(cfg: Any) -> Optional[Paging]:
    """The `rollout` config's paged engine (None: the static engine)."""
    if cfg is None or cfg.engine != "paged":
        return None
    return Paging(cfg.slots or 0, cfg.page_size or 16, cfg.pages or 0)


class Out(NamedTuple):
    """Per request: the static engine's Rollout fields, and whether it emitted an EOS."""

    tokens: Array
    mask: Array
    logps: Array
    ended: Array


class State(NamedTuple):
    cache: PagedKV
    free: Array  # [pages]: free page ids in free[:top]
    top: Array
    request: Array  # [S] the request in each slot (-1: free)
    step: Array  # [S] tokens it sampled so far
    length: Array  # [S] its prompt's length
    need: Array  # [S] pages it holds
    last: Array  # [S, V] the logits its next token is drawn from
    next: Array  # the next request to admit
    out: Out


def sizes(p: Paging, rows: int, prompt: int, new: int) -> tuple[int, int, int]:
    """(slots, pool pages, table width) of `rows` requests of `prompt` + `new` tokens at most."""
    slots, width = min(p.slots or rows, rows), -(-(prompt + new) // p.page_size)
    pages = p.pages or slots * width + 1
    if pages - 1 < width:
        raise ConfigError(f"'rollout.pages'={pages} cannot hold one request: a prompt of {prompt} tokens and "
                          f"{new} new ones fill {width} pages of rollout.page_size={p.page_size}, plus the "
                          f"scratch page. Set rollout.pages >= {width + 1} (null: every slot's longest request).")
    return slots, pages, width


def _pages(length: Array, new: int, size: int) -> Array:
    """The pages a request of a `length`-token prompt may fill: ceil((length + new) / size)."""
    return (length + new + size - 1) // size


def _admit(model: nnx.Module, st: State, ids: Array, mask: Array, new: int) -> State:
    """Prefill request `st.next` into the first free slot, on pages popped from the free list."""
    slot, r, size = jnp.argmax(st.request < 0), st.next, st.cache.k[0].shape[1]
    width = st.cache.table.shape[1]
    length = mask[r].sum()
    need = _pages(length, new, size)
    j = jnp.arange(width)
    row = jnp.where(j < need, st.free[jnp.maximum(st.top - 1 - j, 0)], 0)
    prompt, real = ids[r][None], mask[r][None]
    positions = jnp.maximum(jnp.cumsum(real, -1) - 1, 0)
    logits, cache = model(prompt, positions, segment_ids=real, cache=st.cache._replace(table=row[None]))
    cache = cache._replace(table=st.cache.table.at[slot].set(row))
    return st._replace(cache=cache, top=st.top - need, request=st.request.at[slot].set(r),
                       step=st.step.at[slot].set(0), length=st.length.at[slot].set(length),
                       need=st.need.at[slot].set(need), last=st.last.at[slot].set(logits[0, -1]), next=r + 1)


def _release(st: State, done: Array) -> State:
    """Push the pages of the `done` slots back on the free list and free the slots."""
    counts = jnp.where(done, st.need, 0)
    start = st.top + jnp.cumsum(counts) - counts
    j = jnp.arange(st.cache.table.shape[1])
    at = jnp.where(j[None] < counts[:, None], start[:, None] + j[None], st.free.shape[0])  # out of range: dropped
    free = st.free.at[at].set(st.cache.table, mode="drop")
    return st._replace(free=free, top=st.top + counts.sum(), request=jnp.where(done, -1, st.request))


def _decode(model: nnx.Module, st: State, keys: Array, s: Sampling) -> State:
    """Sample every busy slot's next token, record it, run the model on it; free the slots that ended."""
    busy = st.request >= 0
    rows = jnp.maximum(st.request, 0)
    token, logp = sample_token(st.last, jax.vmap(jax.random.fold_in)(keys[rows], st.step), s)
    ended = busy & jnp.isin(token, jnp.asarray(s.eos_ids or (-1,), jnp.int32))
    at = (jnp.where(busy, st.request, st.out.tokens.shape[0]), st.step)  # a free slot writes nowhere
    out = Out(st.out.tokens.at[at].set(token, mode="drop"), st.out.mask.at[at].set(1, mode="drop"),
              st.out.logps.at[at].set(logp, mode="drop"), st.out.ended.at[at[0]].set(ended, mode="drop"))
    positions = (st.length + st.step)[:, None]
    logits, cache = model(token[:, None], positions, segment_ids=busy[:, None].astype(jnp.int32), cache=st.cache)
    st = st._replace(cache=cache, step=st.step + busy, last=logits[:, -1], out=out)
    return _release(st, ended | (busy & (st.step >= s.max_new_tokens)))


def generate_paged(model: nnx.Module, prompt_ids: Array, prompt_mask: Array, keys: Array, s: Sampling,
                   p: Paging) -> tuple[Array, Array, Array, Array]:
    """(tokens, mask, truncated, log-probs) of `prompt_ids` [B, P] as stack.rollout.generate returns them."""
    b, prompt = prompt_ids.shape
    n, size = s.max_new_tokens, p.page_size
    slots, pages, width = sizes(p, b, prompt, n)
    out = Out(jnp.full((b, n), s.pad_id, jnp.int32), jnp.zeros((b, n), jnp.int32),
              jnp.zeros((b, n), jnp.float32), jnp.zeros((b,), bool))
    idle = jnp.full((slots,), -1, jnp.int32)
    st = State(init_paged(model, slots, pages, size, width), jnp.arange(pages, dtype=jnp.int32), jnp.int32(pages - 1),
               idle, idle * 0, idle * 0, idle * 0, jnp.zeros((slots, model.embed.num_embeddings), jnp.float32),
               jnp.int32(0), out)
    st = st._replace(free=jnp.roll(st.free, -1))  # pages 1..pages-1 free; page 0 is scratch

    def admissible(st: State) -> Array:
        r = jnp.minimum(st.next, b - 1)
        need = _pages(prompt_mask[r].sum(), n, size)
        return (st.next < b) & jnp.any(st.request < 0) & (st.top >= need)

    def body(st: State) -> State:
        st = jax.lax.while_loop(admissible, lambda st: _admit(model, st, prompt_ids, prompt_mask, n), st)
        return _decode(model, st, keys, s)

    st = jax.lax.while_loop(lambda st: (st.next < b) | jnp.any(st.request >= 0), body, st)
    return st.out.tokens, st.out.mask, ~st.out.ended, st.out.logps
