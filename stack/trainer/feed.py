"""Data into rounds: read a round's batches on the host, hand them to the device in one call."""

import time
from collections.abc import Iterable
from typing import Any, NamedTuple

import jax
import numpy as np

from stack.parallel import global_batch


class Round(NamedTuple):
    batch: dict[str, jax.Array]  # [n, rows, ...] global arrays
    host: dict[str, np.ndarray]  # host-only columns (strings), same layout
    data_state: Any  # the iterator's state after this round: a resume continues from it


class Feed:
    """Reads `reads` data batches per round from `batches` (a Grain pipeline, or any iterable
    whose iterator has get_state / set_state / close) and counts the time spent waiting."""

    def __init__(self, batches: Iterable, sharding: jax.sharding.NamedSharding, reads: int):
        self.batches, self.sharding, self.reads = batches, sharding, reads
        self._it = iter(batches)
        self.waited = 0.0  # seconds spent in next(); the Throughput hook reads and resets it

    def use(self, batches: Iterable) -> None:
        """Read from `batches` from now on (from its start), e.g. with precomputed columns attached."""
        self.close()
        self.batches, self._it = batches, iter(batches)

    def restore(self, state: Any) -> None:
        self._it.set_state(state)

    def read(self) -> Round:
        start = time.perf_counter()
        rows = [next(self._it) for _ in range(self.reads)]
        state = self._it.get_state()
        self.waited += time.perf_counter() - start
        return Round(*global_batch(rows, self.sharding), state)

    def close(self) -> None:
        if hasattr(self._it, "close"):
            self._it.close()  # stops Grain's reader threads / worker processes
