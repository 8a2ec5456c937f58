"""Data into rounds: read a round's batches on the host, hand them to the device in one call.

The loop reads the next round right after dispatching a round's last step, so reading overlaps
the device's work; it runs ahead of the device by a step or more. Of the time spent reading,
only a read that ends after the device has finished the work dispatched before it can have
held the device up: that time (the whole read, an upper bound) is the stall, `stalled`.
"""

import time
from collections.abc import Iterable
from typing import Any, NamedTuple

import jax
import numpy as np

from stack.hardware.mesh import global_batch


class Round(NamedTuple):
    batch: dict[str, jax.Array]  # [n, rows, ...] global arrays
    host: dict[str, np.ndarray]  # host-only columns (strings), same layout
    data_state: Any  # the iterator's state after this round: a resume continues from it


class Feed:
    """Reads `reads` data batches per round from `batches` (a Grain pipeline, or any iterable
    whose iterator has get_state / set_state / close) and counts the time spent reading and,
    of that, the time the device may have stalled for want of data (the Throughput hook reads
    and resets both)."""

    def __init__(self, batches: Iterable, sharding: jax.sharding.NamedSharding, reads: int):
        self.batches, self.sharding, self.reads = batches, sharding, reads
        self._it = iter(batches)
        self.read_seconds = self.stalled = 0.0

    def use(self, batches: Iterable) -> None:
        """Read from `batches` from now on (from its start), e.g. with precomputed columns attached."""
        self.close()
        self.batches, self._it = batches, iter(batches)

    def restore(self, state: Any) -> None:
        self._it.set_state(state)

    def read(self, busy: Any = None) -> Round:
        """The next round. `busy`: outputs of the last work dispatched to the device; the read
        counts as a stall when they are ready by its end (or when there are none)."""
        start = time.perf_counter()
        rows = [next(self._it) for _ in range(self.reads)]
        state = self._it.get_state()
        seconds = time.perf_counter() - start
        self.read_seconds += seconds
        if busy is None or all(x.is_ready() for x in jax.tree.leaves(busy) if isinstance(x, jax.Array)):
            self.stalled += seconds
        return Round(*global_batch(rows, self.sharding), state)

    def close(self) -> None:
        if hasattr(self._it, "close"):
            self._it.close()  # stops Grain's reader threads / worker processes
