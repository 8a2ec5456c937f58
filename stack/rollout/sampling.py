"""Sampling filters and one sampling step, in the order Hugging Face applies its warpers:
temperature, then top-k, then top-p (nucleus: the smallest set of tokens whose probability
reaches `top_p`, computed on the temperature-scaled distribution)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import jax
import jax.numpy as jnp

if TYPE_CHECKING:
    from stack.rollout.paged import Paging

Array = jax.Array


@dataclass(frozen=True)
class Sampling:
    """How completions are drawn (static: part of the compiled program)."""

    max_new_tokens: int
    temperature: float = 1.0  # 0: greedy (argmax)
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    eos_ids: tuple[int, ...] = ()
    pad_id: int = 0
    paging: Optional[Paging] = None  # the paged engine's sizes (stack.rollout.paged); None: the static engine


def filter_logits(logits: Array, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Array:
    """`logits / temperature` with -inf outside the top-k and the top-p nucleus."""
    logits = logits.astype(jnp.float32) / temperature
    vocab = logits.shape[-1]
    if top_k and top_k < vocab:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p < 1.0:  # sorted on the top-k prefix only (a full sort of a large vocabulary is slow)
        values, _ = jax.lax.top_k(logits, top_k if top_k and top_k < vocab else vocab)
        probs = jax.nn.softmax(values, axis=-1)
        keep = jnp.cumsum(probs, axis=-1) - probs < top_p  # the first token is always kept
        threshold = jnp.min(jnp.where(keep, values, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return logits


def sample_token(logits: Array, keys: Array, s: Sampling) -> tuple[Array, Array]:
    """(token [B], its log-prob [B]) from logits [B, V], one key per row.

    The token is drawn from the filtered distribution; its log-prob is that of the policy's tempered,
    unfiltered distribution (`logits / temperature`, untempered when greedy): the log-prob the
    training forward computes (TRL GRPOTrainer: top-k/top-p act in generation only), so the two
    agree up to numerics.
    """
    scaled = logits.astype(jnp.float32) / (s.temperature or 1.0)
    if s.temperature == 0:
        token = jnp.argmax(logits, axis=-1)
    else:
        token = jax.vmap(jax.random.categorical)(keys, filter_logits(scaled, 1.0, s.top_k, s.top_p))
    logp = jax.nn.log_softmax(scaled, axis=-1)
    return token.astype(jnp.int32), jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]
