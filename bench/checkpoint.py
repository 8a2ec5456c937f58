"""Checkpoint cost: how long an async save blocks the training loop, over a synchronous save.

    python bench/checkpoint.py            # ~110 MB state: params + AdamW moments

Both save the same state (the loop's {"params", "opt_state"} plus the JSON data/meta items)
through `stack.checkpoint.Checkpointer`; the async time is what `save()` takes before it
returns (the device-to-host copy), the sync time is the whole write. Goal: ratio <= 0.05.
Restore is the time to read the newest step back into the live shardings.
"""

import statistics
import tempfile
import time

import jax
import optax
from flax import nnx
from hydra import compose, initialize_config_module

from stack.checkpoint import Checkpointer
from stack.models.llama import init_model

MODEL = ["model.d_model=512", "model.n_layers=3", "model.n_heads=8", "model.n_kv_heads=4", "model.d_ff=1408"]


def main(trials: int = 3) -> None:
    with initialize_config_module("stack.conf", version_base=None):
        cfg = compose("config", overrides=[*MODEL, "checkpoint=local", "checkpoint.keep=1"])
    _, params, _ = nnx.split(init_model(cfg.model, 0), nnx.Param, ...)
    state = {"params": params, "opt_state": optax.adamw(1e-3).init(params)}
    mb = sum(x.nbytes for x in jax.tree.leaves(state)) / 2**20
    blocked, full, restore = [], [], []
    for trial in range(trials):
        for async_save, times in ((True, blocked), (False, full)):
            cfg.checkpoint.async_save = async_save
            ckpt = Checkpointer(cfg, tempfile.mkdtemp())
            start = time.perf_counter()
            ckpt.save(1, state, {"next_index": 0}, {})
            times.append(time.perf_counter() - start)
            ckpt.close()
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
        start = time.perf_counter()
        jax.block_until_ready(ckpt.restore(abstract).state)
        restore.append(time.perf_counter() - start)
    a, s = statistics.median(blocked), statistics.median(full)
    print(f"state {mb:.0f} MB, {trials} trials (medians): async save blocks {a * 1e3:.0f} ms, "
          f"sync save {s * 1e3:.0f} ms -> ratio {a / s:.3f} (goal <= 0.05); restore {statistics.median(restore) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
