"""Checkpoint cost: how long a save blocks the training loop, over a synchronous save.

    python bench/checkpoint.py            # ~110 MB state: params + AdamW moments, 9 saves each
    python bench/checkpoint.py --quick    # ~30 MB, 2 saves each

Each saves the same state (pure dicts of params and AdamW moments, as a TrainState holds them,
plus the JSON data/meta items) through the trainer's checkpoint hook
(`stack.engine.trainer.checkpointing.Checkpointing.save`), timing what the call takes before the loop
may go on, after a first save of the same managers (what a run sees from its second save on):
- overlapped (`checkpoint.overlap`): a device copy of the state, the save in a thread;
- Orbax async only (`checkpoint.overlap=false`): the loop waits for the device-to-host copy;
- sync (`checkpoint.async_save=false checkpoint.overlap=false`): the whole write.
Goal: overlapped / sync <= 0.05. Restore is the time to read the newest step back.
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

from stack.checkpoint.manager import Checkpointer
from stack.engine.trainer.checkpointing import Checkpointing
from stack.engine.trainer.nonfinite import NonFinite
from stack.models.init import init_model

MODEL = ["model.d_model=512", "model.n_layers=3", "model.n_heads=8", "model.n_kv_heads=4", "model.d_ff=1408"]
QUICK = ["model.d_model=256", "model.n_layers=3", "model.n_heads=4", "model.n_kv_heads=2", "model.d_ff=704"]


def save_times(cfg, state, async_save: bool, overlap: bool, saves: int) -> tuple[list[float], Checkpointer]:
    """Seconds each hook save blocked the caller, after a first (warm-up) save of the same managers."""
    cfg.checkpoint.async_save = async_save
    ckpt = Checkpointer(cfg, tempfile.mkdtemp())
    hook = Checkpointing(ckpt, NonFinite("stop"), overlap)
    times = []
    for step in range(saves + 1):
        start = time.perf_counter()
        hook.save(step, state, {"next_index": 0}, {}, ckpt.tiers)
        times.append(time.perf_counter() - start)
        hook.thread.join()  # the loop saves every N steps, not back to back
        ckpt.tiers[0].manager.wait_until_finished()
    return times[1:], ckpt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~30 MB state, 2 saves each")
    args = parser.parse_args()
    saves = 2 if args.quick else 9  # the blocking is a few ms: one disturbed save in 5 moved the median (0.075 once)
    with initialize_config_module("stack.conf", version_base=None):
        cfg = compose("config", overrides=[*(QUICK if args.quick else MODEL), "checkpoint=local", "checkpoint.keep=2"])
    params = nnx.to_pure_dict(nnx.state(init_model(cfg.model, 0), nnx.Param))
    state = {"params": params, "opt_state": optax.adamw(1e-3).init(params)}
    mb = sum(x.nbytes for x in jax.tree.leaves(state)) / 2**20
    blocked, _ = save_times(cfg, state, True, True, saves)
    orbax_async, _ = save_times(cfg, state, True, False, saves)
    full, ckpt = save_times(cfg, state, False, False, saves)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    start = time.perf_counter()
    jax.block_until_ready(ckpt.restore(abstract).state)
    restore = time.perf_counter() - start
    a, o, s = statistics.median(blocked), statistics.median(orbax_async), statistics.median(full)
    print(f"state {mb:.0f} MB, {saves} saves each (medians, after a warm-up save): overlapped save blocks "
          f"{a * 1e3:.1f} ms, Orbax async alone {o * 1e3:.0f} ms ({o / s:.3f}), sync save {s * 1e3:.0f} ms -> "
          f"ratio {a / s:.3f} (goal <= 0.05); restore {restore * 1e3:.0f} ms")
    emit(f"async save blocking / sync save ({mb:.0f} MB)", a / s, "<= 0.05")


if __name__ == "__main__":
    main()
