"""A round's extra generation batches (DAPO's dynamic sampling), by hand: which rows a round keeps,
in what order, and when it stops drawing."""

import jax.numpy as jnp
import numpy as np

from stack.engine.trainer.refill import chosen_rows, refill


def test_kept_rows_first_in_the_order_drawn_then_the_rest():
    first = np.array([[True, True, False, False], [False, False, False, False]])  # [n=2, rows=4], groups of 2
    second = np.array([[False, False, True, True], [True, True, False, False]])
    np.testing.assert_array_equal(chosen_rows([first, second]), [0, 1, 10, 11, 12, 13, 2, 3])


def draws_of(rewards_per_draw):
    """Draws whose experience is their row numbers ([1, 4]) and whose rows are kept where `kept`."""
    out = []
    for i, kept in enumerate(rewards_per_draw):
        out.append(({"row": jnp.arange(4)[None] + 4 * i, "kept": jnp.asarray(kept)[None]}, None))
    return out


def test_refill_draws_until_the_batch_is_kept_rows_or_the_draws_run_out():
    pending = draws_of([[0, 0, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]])
    calls = []

    def draw():
        calls.append(1)
        return pending[len(calls)]

    keep = lambda xp, scores: xp["kept"] > 0  # noqa: E731
    (xp, scores), m = refill(pending[0], keep, draw, generations=4)
    assert len(calls) == 1 and scores is None  # 2 kept + 2 kept: full after the second draw
    np.testing.assert_array_equal(np.asarray(xp["row"]), [[2, 3, 4, 5]])
    assert float(m["dynamic_sampling/generation_batches"]) == 2 and float(m["dynamic_sampling/kept_fraction"]) == 1
    calls.clear()
    none_kept = draws_of([[0, 0, 0, 0]] * 3)
    (xp, _), m = refill(none_kept[0], keep, lambda: none_kept[1], generations=2)
    np.testing.assert_array_equal(np.asarray(xp["row"]), [[0, 1, 2, 3]])  # out of draws: the first rows
    assert float(m["dynamic_sampling/generation_batches"]) == 2 and float(m["dynamic_sampling/kept_fraction"]) == 0
    (xp, _), m = refill(pending[2], keep, draw, generations=4)
    assert not calls and float(m["dynamic_sampling/generation_batches"]) == 1  # all kept: no more draws
