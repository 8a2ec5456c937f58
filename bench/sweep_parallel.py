"""A 4-job sweep's wall time with 2 joblib workers / with Hydra's basic launcher (one job after
another), the same command otherwise.

    python bench/sweep_parallel.py [--trials 2] [--steps 60]
    python bench/sweep_parallel.py --quick   # one trial of 10-step jobs, 4 seeds of one lr

Each trial runs both sweeps in fresh processes, alternating which goes first, against one
shared persistent compilation cache (python -m bench's, else a fresh one) warmed before timing
(so both pay the same compile cost).
Printed: the median wall seconds of each and their ratio (goal <= 0.65), and the ratio the
jobs' training alone allows: a job's steady tokens/s (its logged windows after the first, the
median over jobs) with the basic launcher / twice that of a joblib job. A tiny job keeps more than
one core busy (the loop dispatches while XLA computes), so a job pinned to one of 2 cores trains
slower than a job alone on both, and that ratio bounds what running two at once saves of the
training. Start-up, composition and tracing are one-threaded: short jobs can beat the bound.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from rows import emit  # bench/ is on sys.path when run as a script

SWEEP = ["-m", "+recipe=llama_sft", "checkpoint=none", "logger=jsonl", "trainer.eval_every=0", "trainer.eval_batches=1"]
GRID = ["optimizer.lr=1e-3,3e-3", "seed=0,1"]
QUICK_GRID = ["optimizer.lr=1e-3", "seed=0,1,2,3"]  # one program: its cache is warmed by one job
PARALLEL = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]


def sweep(root: str, steps: int, extra: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, a job's steady tokens/s) of one sweep run to completion (`extra` last: it
    may narrow the grid)."""
    start, out = time.perf_counter(), tempfile.mkdtemp(dir=root)
    subprocess.run([sys.executable, "-m", "stack", *SWEEP, f"trainer.steps={steps}", *extra,
                    f"hydra.sweep.dir={out}"], capture_output=True, env=env, check=True)
    return time.perf_counter() - start, job_tokens_per_sec(out)


def job_tokens_per_sec(sweep_dir: str) -> float:
    """The median over the sweep's jobs of a job's logged tokens/s, its first window left out
    (it holds the compiling step)."""
    per_job = []
    for path in glob.glob(os.path.join(sweep_dir, "*", "metrics.jsonl")):
        with open(path) as f:
            windows = [row["perf/tokens_per_sec"] for row in map(json.loads, f) if "perf/tokens_per_sec" in row]
        per_job.append(statistics.median(windows[1:] or windows))
    return statistics.median(per_job)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--quick", action="store_true", help="one trial of 10-step jobs")
    args = parser.parse_args()
    grid = QUICK_GRID if args.quick else GRID
    if args.quick:
        args.trials, args.steps = 1, 10
    root = tempfile.mkdtemp()
    env = {**os.environ, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",  # every program (jax's default: >= 1 s)
           "JAX_COMPILATION_CACHE_DIR": os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(root, "jax")}
    sweep(root, args.steps, [*grid, "seed=0"], env)  # warm the cache for both: a seed changes no program, steps do
    basic, joblib = [], []
    for trial in range(args.trials):
        order = [(basic, []), (joblib, PARALLEL)][:: 1 if trial % 2 == 0 else -1]
        for times, extra in order:
            times.append(sweep(root, args.steps, [*grid, *extra], env))
        print(f"  trial {trial}: basic {basic[-1][0]:.1f}s, joblib {joblib[-1][0]:.1f}s", flush=True)
    (b, b_tok), (j, j_tok) = (tuple(statistics.median(x) for x in zip(*runs, strict=True)) for runs in (basic, joblib))
    print(f"4-job sweep on {os.cpu_count()} cores: basic launcher {b:.1f}s, joblib n_jobs=2 {j:.1f}s, "
          f"ratio {j / b:.2f} (goal <= 0.65); a job trains at {b_tok:,.0f} tok/s alone, {j_tok:,.0f} two at a "
          f"time: training alone allows {b_tok / (2 * j_tok):.2f}")
    emit("4-job sweep: 2 joblib workers / basic launcher", j / b, "<= 0.65")


if __name__ == "__main__":
    main()
