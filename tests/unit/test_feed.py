"""The feed's data accounting: the time spent reading, and of it only the reads the device may
have waited for (its dispatched work was done by the read's end) count as a stall."""

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from stack.engine.trainer.feed import Feed

READ = 0.02  # seconds each next() takes


class SlowBatches:
    """Batches that take READ seconds each, with the iterator protocol the feed needs."""

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        time.sleep(READ)
        return {"inputs": np.zeros((2, 4), np.int32)}

    def get_state(self) -> dict[str, int]:
        return {}


def feed() -> Feed:
    mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
    return Feed(SlowBatches(), NamedSharding(mesh, PartitionSpec()), reads=2)


@jax.jit
def long_work(x: jax.Array) -> jax.Array:
    """Far longer than a read (about a second on a CPU core)."""
    return jax.lax.fori_loop(0, 200, lambda _, a: jnp.tanh(a @ a), x).sum()


def test_a_read_while_the_device_is_busy_is_not_a_stall():
    f = feed()
    busy = long_work(jnp.full((600, 600), 1e-3))
    batch, _, _ = f.read(busy=busy)
    assert not busy.is_ready()  # the device was still working when the read ended
    assert f.stalled == 0.0 and f.read_seconds >= 2 * READ
    assert batch["inputs"].shape == (2, 2, 4)


def test_a_read_after_the_device_is_done_or_before_any_work_is_a_stall():
    f = feed()
    done = jax.block_until_ready(jnp.ones(3) * 2)
    f.read(busy=done)
    f.read()
    assert f.stalled == f.read_seconds >= 4 * READ
