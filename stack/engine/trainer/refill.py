"""A round that draws more generation batches while its algorithm's `keep` leaves rows out (DAPO's
dynamic sampling: drop the groups whose completions all got the same reward, fill the batch with
fresh ones), at most `schedule.generations` batches. The batch keeps its size: the kept rows in
the order drawn, then, if the draws ran out, rows that were not kept."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Draw = tuple[dict[str, jax.Array], Any]  # (experience [n, rows, ...], its host scores or None)


def chosen_rows(kept: list[np.ndarray]) -> np.ndarray:
    """Indices into the draws' rows laid end to end ([n × rows] each): the kept rows first, in order,
    then the others, as many as one draw holds."""
    flat = np.concatenate([k.reshape(-1) for k in kept])
    order = np.concatenate([np.flatnonzero(flat), np.flatnonzero(~flat)])
    return order[: kept[0].size]


def gathered(draws: list[Draw], rows: np.ndarray) -> Draw:
    """`rows` of the draws' experiences (and scores), in the layout of one draw."""
    def take(*parts: jax.Array) -> jax.Array:
        n, r = parts[0].shape[:2]
        whole = jnp.concatenate([p.reshape(n * r, *p.shape[2:]) for p in parts])
        return jnp.take(whole, jnp.asarray(rows), axis=0).reshape(parts[0].shape)

    xp = {k: take(*(d[0][k] for d in draws)) for k in draws[0][0]}
    scores = None if draws[0][1] is None else take(*(d[1] for d in draws))
    return xp, scores


def refill(first: Draw, keep: Callable[[Any, Any], jax.Array], draw: Callable[[], Draw],
           generations: int) -> tuple[Draw, dict[str, jax.Array]]:
    """The round's experience from `first` and up to `generations` − 1 more `draw`s, and the metrics
    `dynamic_sampling/{generation_batches,kept_fraction}` (of the rows trained on, those kept)."""
    draws, kept = [first], [np.asarray(keep(*first))]
    while sum(k.sum() for k in kept) < kept[0].size and len(draws) < generations:
        draws.append(draw())
        kept.append(np.asarray(keep(*draws[-1])))
    rows = chosen_rows(kept)
    fraction = np.concatenate([k.reshape(-1) for k in kept])[rows].mean()
    metrics = {"dynamic_sampling/generation_batches": jnp.float32(len(draws)),
               "dynamic_sampling/kept_fraction": jnp.float32(fraction)}
    return (first if len(draws) == 1 else gathered(draws, rows)), metrics
