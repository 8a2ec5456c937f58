"""Checkpoint cost: how long an async save blocks the training loop, over a synchronous save.

    python bench/checkpoint.py            # ~110 MB state: params + AdamW moments
    python bench/checkpoint.py --quick    # ~30 MB, 2 saves each

Both save the same state (a TrainState's params and AdamW moments, plus the JSON data/meta items)
through `stack.checkpoint.Checkpointer`; the async time is what `save()` takes before it
returns (the device-to-host copy), the sync time is the whole write, both after a first save
of the same manager (what a training run sees from its second save on). Goal: ratio <= 0.05.
Restore is the time to read the newest step back into the live shardings.
"""

import argparse
import statistics
import tempfile
import time

import jax
import optax
from flax import nnx
from hydra import compose, initialize_config_module

from rows import emit  # bench/ is on sys.path when run as a script
from stack.checkpoint import Checkpointer
from stack.models.llama import init_model

MODEL = ["model.d_model=512", "model.n_layers=3", "model.n_heads=8", "model.n_kv_heads=4", "model.d_ff=1408"]
QUICK = ["model.d_model=256", "model.n_layers=3", "model.n_heads=4", "model.n_kv_heads=2", "model.d_ff=704"]


def save_times(cfg, state, async_save: bool, saves: int) -> tuple[list[float], Checkpointer]:
    """Seconds each `save()` call took, after a first (warm-up) save of the same manager."""
    cfg.checkpoint.async_save = async_save
    ckpt = Checkpointer(cfg, tempfile.mkdtemp())
    times = []
    for step in range(saves + 1):
        start = time.perf_counter()
        ckpt.save(step, state, {"next_index": 0}, {})
        times.append(time.perf_counter() - start)
        ckpt.tiers[0].manager.wait_until_finished()  # the loop saves every N steps, not back to back
    return times[1:], ckpt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~30 MB state, 2 saves each")
    args = parser.parse_args()
    saves = 2 if args.quick else 5
    with initialize_config_module("stack.conf", version_base=None):
        cfg = compose("config", overrides=[*(QUICK if args.quick else MODEL), "checkpoint=local", "checkpoint.keep=2"])
    _, params, _ = nnx.split(init_model(cfg.model, 0), nnx.Param, ...)
    state = {"params": params, "opt_state": optax.adamw(1e-3).init(params)}
    mb = sum(x.nbytes for x in jax.tree.leaves(state)) / 2**20
    blocked, _ = save_times(cfg, state, True, saves)
    full, ckpt = save_times(cfg, state, False, saves)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    start = time.perf_counter()
    jax.block_until_ready(ckpt.restore(abstract).state)
    restore = time.perf_counter() - start
    a, s = statistics.median(blocked), statistics.median(full)
    print(f"state {mb:.0f} MB, {saves} saves each (medians, after a warm-up save): async save blocks "
          f"{a * 1e3:.0f} ms, sync save {s * 1e3:.0f} ms -> ratio {a / s:.3f} (goal <= 0.05); "
          f"restore {restore * 1e3:.0f} ms")
    emit(f"async save blocking / sync save ({mb:.0f} MB)", a / s, "<= 0.05")


if __name__ == "__main__":
    main()
