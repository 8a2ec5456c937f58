"""Prefill and decode on device: completions for a batch of left-padded prompts.

The prompt [B, P] is written into a KV cache of P + max_new_tokens slots in one forward
(positions = cumsum(mask) - 1, so padding shifts nothing); then a `lax.while_loop` samples
one token per row per iteration and runs the model on it, until every row has emitted one
of the EOS ids or `max_new_tokens` is reached. No Python runs per token. Row b's key at
step t is fold_in(keys[b], t): callers derive `keys` from what identifies a sample (the
round's key, the record's index, the sample number; see `sample_keys`), so a completion
does not depend on the batch it was drawn in, its padding or the mesh.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core.spmd import get_logical_axis_rules
from jax.sharding import PartitionSpec

from stack.models.kv_cache import KVCache, init_cache
from stack.rollout.paged import generate_paged
from stack.rollout.sampling import Sampling, sample_token

Array = jax.Array


class Rollout(NamedTuple):
    tokens: Array  # [B, N] completion tokens (pad after the end)
    mask: Array  # [B, N] int32: 1 up to and including the first EOS (stopping is learned)
    truncated: Array  # [B] bool: no EOS within max_new_tokens
    logps: Array  # [B, N] log-prob of each token under the tempered, unfiltered distribution (sample_token)


def sample_keys(key: Array, records: Array, samples: Array) -> Array:
    """One key per completion: fold_in(fold_in(key, record index), sample number)."""
    return jax.vmap(lambda r, s: jax.random.fold_in(jax.random.fold_in(key, r), s))(records, samples)


def _constrain(cache: KVCache) -> KVCache:
    """Lay the cache out like the activations: rows over the batch axes, kv heads over theirs."""
    if jax.sharding.get_abstract_mesh().empty:
        return cache
    rules = dict(get_logical_axis_rules())
    spec = PartitionSpec(rules.get("batch"), None, rules.get("kv_heads"), None)
    put = lambda x: jax.lax.with_sharding_constraint(x, spec)  # noqa: E731
    return cache._replace(k=tuple(map(put, cache.k)), v=tuple(map(put, cache.v)))


def generate(model: nnx.Module, prompt_ids: Array, prompt_mask: Array, keys: Array, s: Sampling) -> Rollout:
    """Completions of `prompt_ids` [B, P] (left-padded; `prompt_mask` 1 on real tokens); by the paged
    engine when `s.paging` is set."""
    if s.paging is not None:
        return Rollout(*generate_paged(model, prompt_ids, prompt_mask, keys, s, s.paging))
    b, p = prompt_ids.shape
    n = s.max_new_tokens
    positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=-1) - 1, 0)
    cache = _constrain(init_cache(model, b, p + n))
    logits, cache = model(prompt_ids, positions, segment_ids=prompt_mask, cache=cache)
    lengths, eos = prompt_mask.sum(-1), jnp.asarray(s.eos_ids or (-1,), jnp.int32)
    zeros = jnp.zeros((b, n), jnp.int32)

    def body(carry: tuple) -> tuple:
        step, cache, last, tokens, mask, logps, done = carry
        token, logp = sample_token(last, jax.vmap(jax.random.fold_in, (0, None))(keys, step), s)
        token = jnp.where(done, s.pad_id, token)
        tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, step))
        mask = jax.lax.dynamic_update_slice(mask, (~done).astype(jnp.int32)[:, None], (0, step))
        logps = jax.lax.dynamic_update_slice(logps, jnp.where(done, 0.0, logp)[:, None], (0, step))
        live = (~done).astype(jnp.int32)[:, None]
        done = done | jnp.isin(token, eos)
        logits, cache = model(token[:, None], (lengths + step)[:, None], segment_ids=live, cache=cache)
        return step + 1, cache, logits[:, -1], tokens, mask, logps, done

    def cond(carry: tuple) -> Array:
        return (carry[0] < n) & ~jnp.all(carry[-1])

    init = (jnp.zeros((), jnp.int32), cache, logits[:, -1], zeros + s.pad_id, zeros,
            jnp.zeros((b, n), jnp.float32), jnp.zeros((b,), bool))
    _, _, _, tokens, mask, logps, done = jax.lax.while_loop(cond, body, init)
    return Rollout(tokens, mask, ~done, logps)
