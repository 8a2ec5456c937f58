"""Time to first step: a cold run (empty compilation cache) vs a rerun of the same command
(every program loaded from the persistent cache, `trainer.compilation_cache`).

    python bench/first_step.py [--trials 3]
    python bench/first_step.py --quick       # one trial

Each trial runs `python -m stack +recipe=llama_sft trainer.steps=2` twice in fresh processes
against a new cache dir: cold, then warm. Printed: the medians of the run's own compile
seconds (the first round's program traced, lowered and compiled or loaded from the cache in a
thread beside the model init, stack.engine.precompile, + start of the loop -> first step done), of XLA's
compile seconds over every program of the run (jax's `backend_compile_duration` events: a compile,
or a load from the cache) and of the process wall time, and warm/cold ratios (goal for compiling:
<= 0.2, i.e. >= 5x faster).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from rows import emit  # bench/ is on sys.path when run as a script

RUN = ["+recipe=llama_sft", "checkpoint=none", "trainer.steps=2", "trainer.eval_batches=1", "logger=jsonl"]
# `python -m stack`, also printing the sum of XLA's compile (or cache load) seconds at exit
CLI = """import atexit, runpy, sys
import jax.monitoring
seconds = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, s, **kw: seconds.append(s) if event.endswith("backend_compile_duration") else None)
atexit.register(lambda: print(f"xla compile {sum(seconds):.4f}s", flush=True))
sys.argv[0] = "stack"
runpy.run_module("stack", run_name="__main__")
"""


def one_run(cache: str, run_dir: str) -> tuple[float, float, float]:
    """(compile seconds the run reports, XLA compile seconds, process wall seconds)."""
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": "", "STACK_CACHE_DIR": os.path.dirname(cache)}
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CLI, *RUN, f"trainer.compilation_cache={cache}",
                          f"run_dir={run_dir}"], capture_output=True, text=True, env=env, check=True).stdout
    wall = time.perf_counter() - start
    return (float(re.search(r"\(compile ([\d.]+)s\)", out).group(1)),
            float(re.search(r"xla compile ([\d.]+)s", out).group(1)), wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one trial")
    args = parser.parse_args()
    args.trials = 1 if args.quick else args.trials
    cold, warm = [], []
    for _ in range(args.trials):
        root = tempfile.mkdtemp()
        cache = os.path.join(root, "jax")
        cold.append(one_run(cache, os.path.join(root, "cold")))
        warm.append(one_run(cache, os.path.join(root, "warm")))
    med = lambda runs, i: statistics.median(r[i] for r in runs)  # noqa: E731
    print(f"compile: cold {med(cold, 0):.2f}s, warm {med(warm, 0):.2f}s, ratio {med(warm, 0) / med(cold, 0):.2f} "
          f"(goal <= 0.2)")
    print(f"XLA compile, every program: cold {med(cold, 1):.2f}s, warm {med(warm, 1):.2f}s, "
          f"ratio {med(warm, 1) / med(cold, 1):.2f} (goal <= 0.2)")
    print(f"process wall: cold {med(cold, 2):.2f}s, warm {med(warm, 2):.2f}s, ratio {med(warm, 2) / med(cold, 2):.2f}")
    emit("compile: cached rerun / cold run", med(warm, 0) / med(cold, 0), "<= 0.2")
    emit("XLA compile, every program: cached rerun / cold run", med(warm, 1) / med(cold, 1), "<= 0.2")


if __name__ == "__main__":
    main()
