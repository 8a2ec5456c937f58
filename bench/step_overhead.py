"""Loop overhead: our steady-state step time / a hand-written `jax.jit` step, same process.

    python bench/step_overhead.py            # tiny and medium
    python bench/step_overhead.py --sizes tiny --trials 5
    python bench/step_overhead.py --quick    # tiny, one trial; medium's FLOP/s from 5 steps

Both sides use the same model, batch and Optax chain (built from one config). Ours is the
real trainer (`stack.engine.trainer.Trainer`: rounds, hooks, donation), once fed the same fixed
batch as the baseline (loop overhead) and once fed by the Grain pipeline (loop + data);
the baseline is a bare jitted value_and_grad + optax update. Trials alternate and the
minimum (least disturbed by other load on the machine) and the median are reported;
the goal is a loop-overhead ratio <= 1.05. Also reported: the medium step's achieved FLOP/s over
the matmul peak (on CPU: stack.hardware.platform's probe, run in this process before every trial, the best
step over the best probe: a single probe read 305 and 494 GFLOP/s in runs minutes apart while the
step held steady; else `perf/mfu`; goal >= 0.60, a row for medium only: tiny's step is too small
to keep the cores' matmul units busy and is printed, not judged).
"""

import argparse
import gc
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from hydra import compose, initialize_config_module
from jax.sharding import NamedSharding, PartitionSpec
from rows import emit  # bench/ is on sys.path when run as a script

from stack.engine.trainer import Trainer
from stack.hardware.cpu_compiler import configure_cpu_compiler
from stack.hardware.cpu_dispatch import configure_cpu_dispatch
from stack.hardware.host_memory import keep_freed_host_memory
from stack.hardware.platform import measure_cpu_peak
from stack.run.build import build

keep_freed_host_memory()  # as `python -m stack` does on CPU before jax starts its threads (stack.cli.app)
gc.freeze()  # the imported heap, as `python -m stack` freezes it after its imports (stack.hardware.gc_freeze)

SIZES = {
    "tiny": ["model=llama_tiny", "trainer.steps=300"],
    "medium": ["model.d_model=512", "model.n_layers=4", "model.n_heads=8", "model.n_kv_heads=4",
               "model.d_ff=1408", "data.seq_len=256", "data.batch_size=8", "trainer.steps=10"],
}


class Capture:
    """A sink that keeps every logged metric dict."""

    def __init__(self):
        self.rows = []

    def log(self, step, metrics):
        self.rows.append(metrics)

    def rewind(self, step):
        pass

    def close(self, summary=None):
        pass


class Fixed:
    """One batch forever, as a data iterator (the trainer's protocol: get_state, set_state,
    close, epoch, and for precomputed columns records, batch_size, ordered / with_columns)."""

    def __init__(self, batch):
        self.batch = batch

    def __iter__(self):
        return self

    def __next__(self):
        return self.batch

    def get_state(self):
        return {"next_index": 0}

    def set_state(self, state):
        pass

    def close(self):
        pass

    def epoch(self, state):
        return 0.0

    @property
    def records(self):
        return len(self.batch["inputs"])

    batch_size = records  # one process's rows of a batch: here every record

    def ordered(self):  # the first pass of precomputed columns: the batch's rows are the records
        yield list(range(self.records)), self.batch

    def with_columns(self, tables):
        return Fixed({**self.batch, **tables})


def experiment(overrides: list[str]):
    with initialize_config_module("stack.conf", version_base=None):
        cfg = compose("config", overrides=overrides + ["logger=jsonl", "trainer.eval_every=0",
                                                       "trainer.eval_batches=1"])
    cfg.trainer.log_every = cfg.trainer.steps  # one window: every step after the compiling one
    # as `python -m stack` does; the process's first call decides (stack.hardware.cpu_dispatch)
    configure_cpu_dispatch(cfg)
    configure_cpu_compiler(cfg)  # as `python -m stack` does (stack.hardware.cpu_compiler)
    return build(cfg, tempfile.mkdtemp())


def fresh(exp, **changes):
    """`exp` with its own copy of the model's arrays (a run donates the ones it starts from)."""
    graphdef, state = nnx.split(exp.model)
    return replace(exp, model=nnx.merge(graphdef, jax.tree.map(jnp.copy, state)), **changes)


def perf_row(exp) -> dict[str, float]:
    """The run's logged perf/* over its steady window (every step after the compiling one)."""
    cap = Capture()
    Trainer(fresh(exp, sinks=(cap,))).run()
    return next(r for r in cap.rows if "perf/step_seconds" in r)


def ours(exp) -> float:
    return perf_row(exp)["perf/step_seconds"]


def baseline(exp) -> float:
    graphdef, params, rest = nnx.split(fresh(exp).model, nnx.Param, ...)
    replicated = NamedSharding(exp.mesh, PartitionSpec())  # as the step's outputs: one compile, not two
    params, opt_state, batch = jax.device_put((params, exp.tx.init(params), exp.eval_batches[0]), replicated)

    @jax.jit
    def step(params, opt_state, batch):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p, rest)(batch["inputs"], batch["positions"], batch["segment_ids"])
            nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
            mask = batch["loss_mask"]
            return (nll * mask).sum() / jnp.maximum(mask.sum(), 1.0)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = exp.tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    step = jax.jit(step.__wrapped__, donate_argnums=(0, 1))
    for _ in range(3):  # warm-up
        params, opt_state, loss = step(params, opt_state, batch)
    jax.block_until_ready(loss)
    n = exp.cfg.trainer.steps - 1
    start = time.perf_counter()
    for _ in range(n):
        params, opt_state, loss = step(params, opt_state, batch)
    jax.block_until_ready(params)
    return (time.perf_counter() - start) / n


FLOPS_SIZE, QUICK_FLOPS_STEPS = "medium", 5  # the size the FLOP/s goal is for; its steps with --quick


def bench_args(doc: str, sizes: dict, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """--sizes and --trials of a bench script (and a header line with the jax version); `parser`
    may carry the script's own arguments."""
    parser = parser or argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(sizes), choices=list(sizes))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help=f"only {next(iter(sizes))}, one trial, <= 80 steps")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.trials = args.sizes[:1], 1
        steps = [o for o in sizes[args.sizes[0]] if o.startswith("trainer.steps=")]
        if steps and int(steps[0].split("=")[1]) > 80:
            sizes[args.sizes[0]] = [o for o in sizes[args.sizes[0]] if o not in steps] + ["trainer.steps=80"]
    # no device yet: stack.hardware.cpu_dispatch first
    print(f"jax {jax.__version__}, {args.trials} alternating trials")
    return args


def overhead_rows(exp, size: str, trials: int, quick: bool) -> None:
    """Loop overhead (fixed batch, Grain data) over the hand-written step, alternating trials;
    the achieved FLOP/s of the fixed-batch runs (a row at FLOPS_SIZE)."""
    on_cpu = jax.default_backend() == "cpu"
    fixed = exp.eval_batches[0]
    a, b, c, achieved = [], [], [], []  # achieved: FLOP/s on CPU, else MFU
    if quick:  # one untimed pass each: a single trial would otherwise be the process's first run
        baseline(exp), ours(replace(exp, train_batches=Fixed(fixed)))
    peaks = []
    for _ in range(trials):
        peaks += [measure_cpu_peak(repeats=10)] if on_cpu else []
        b.append(baseline(exp))
        row = perf_row(replace(exp, train_batches=Fixed(fixed)))
        a.append(row["perf/step_seconds"])
        achieved.append(row["perf/tflops_per_device"] * 1e12 if on_cpu else row["perf/mfu"])
        c.append(ours(replace(exp, train_batches=experiment(SIZES[size]).train_batches)))
    for label, xs in (("loop, fixed batch", a), ("loop + Grain data", c)):
        print(f"{size:7s} {label:18s} min {min(xs) * 1e3:8.2f} ms/step (median {statistics.median(xs) * 1e3:7.2f})"
              f" | hand-written jit min {min(b) * 1e3:8.2f} (median {statistics.median(b) * 1e3:7.2f})"
              f" | ratio of mins {min(xs) / min(b):.3f}, of medians {statistics.median(xs) / statistics.median(b):.3f}")
    emit(f"loop overhead ({size})", min(a) / min(b), "<= 1.05")
    emit(f"loop + Grain data ({size})", min(c) / min(b), "<= 1.05")
    flops_row(size, achieved, peaks)


def flops_row(size: str, achieved: list[float], peaks: list[float]) -> None:
    """The best step's FLOP/s over the best matmul probe (CPU) or the best MFU; a row at FLOPS_SIZE."""
    on_cpu = bool(peaks)
    share = max(achieved) / max(peaks) if on_cpu else max(achieved)
    print(f"{size:7s} achieved FLOP/s over the matmul peak {share:.3f} (goal >= 0.60 at {FLOPS_SIZE})" + (
        f"; steps {', '.join(f'{x / 1e9:.0f}' for x in achieved)} GFLOP/s, probes in this process "
        f"{', '.join(f'{x / 1e9:.0f}' for x in peaks)} GFLOP/s" if on_cpu else ""))
    if size == FLOPS_SIZE:
        emit(f"FLOP/s / matmul peak ({size})", share, ">= 0.60")


def quick_flops(exp) -> None:
    """--quick at FLOPS_SIZE: only the FLOP/s row, from one short fixed-batch run after an untimed one,
    over the better of a probe before and one after it."""
    on_cpu = jax.default_backend() == "cpu"
    fixed = replace(exp, train_batches=Fixed(exp.eval_batches[0]))
    steps, exp.cfg.trainer.steps = exp.cfg.trainer.steps, 2
    Trainer(fresh(fixed, sinks=(Capture(),))).run()  # compiles, warms the process up: two steps
    exp.cfg.trainer.steps = steps
    peaks = [measure_cpu_peak(repeats=10)] if on_cpu else []
    row = perf_row(fixed)
    peaks += [measure_cpu_peak(repeats=10)] if on_cpu else []  # one probe read 340 of ~415 GFLOP/s: 0.712
    flops_row(FLOPS_SIZE, [row["perf/tflops_per_device"] * 1e12 if on_cpu else row["perf/mfu"]], peaks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flops-only", action="store_true", help=argparse.SUPPRESS)  # --quick's FLOPS_SIZE process
    args = bench_args(__doc__, SIZES, parser)
    if args.flops_only:
        return quick_flops(experiment([o for o in SIZES[FLOPS_SIZE] if not o.startswith("trainer.steps=")]
                                      + [f"trainer.steps={QUICK_FLOPS_STEPS}"]))
    if len(args.sizes) > 1:  # one process per size: each runs with its own dispatch mode, as its CLI run would
        for size in args.sizes:
            subprocess.run([sys.executable, __file__, "--sizes", size, "--trials", str(args.trials)], check=True)
        return
    size = args.sizes[0]
    exp = experiment(SIZES[size])
    print(f"{size}: {jax.devices()[0].platform}, async dispatch {jax.config.read('jax_cpu_enable_async_dispatch')}")
    overhead_rows(exp, size, args.trials, args.quick)
    if args.quick and size != FLOPS_SIZE:  # the FLOP/s row's size, briefly, in its own process
        subprocess.run([sys.executable, __file__, "--sizes", FLOPS_SIZE, "--trials", "1", "--flops-only"], check=True)


if __name__ == "__main__":
    main()
