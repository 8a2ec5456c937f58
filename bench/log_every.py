"""Does the logging cadence slow the step? Whole-run steady-state tokens/s of the tiny SFT
recipe (real Grain data) at `trainer.log_every` 1, 10 and 100, interleaved trials in one
process (odd trials in the reverse order); each cadence's best run over the fastest cadence's
best. Goal: every cadence within 3 % (>= 0.97).

Best, not median: the 2-core machine this was written on switches between two speeds ~15 %
apart for seconds at a time (a numpy matmul loop alone shows it), so a run lands in the slow
mode or not. Interference only ever slows a run; with a median over a few trials, which cadence
drew more slow runs decides the ratio (with three equal cadences and this noise a 4-trial
median reads ~0.95). The medians are printed too.

    python bench/log_every.py [--trials 8] [--steps 100]
    python bench/log_every.py --quick        # two trials of 60 steps (one read 0.80 once: a slow spell)
"""

import argparse
import statistics

from rows import emit  # bench/ is on sys.path when run as a script
from step_overhead import Capture, experiment, fresh

from stack.engine.trainer import Trainer

CADENCES = (1, 10, 100)


def tokens_per_sec(exp, every: int) -> float:
    """The run's steady-state tokens/s (the compiling first step left out) at `log_every=every`."""
    exp.cfg.trainer.log_every = every
    return Trainer(fresh(exp, sinks=(Capture(),))).run().perf["perf/tokens_per_sec"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="two trials of 60 steps")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.steps = 2, 60
    exp = experiment(["+recipe=llama_sft", "checkpoint=none", f"trainer.steps={args.steps}"])
    tokens_per_sec(exp, 1)  # warm-up: every program compiled once
    runs: dict[int, list[float]] = {c: [] for c in CADENCES}
    for trial in range(args.trials):
        for every in CADENCES if trial % 2 == 0 else CADENCES[::-1]:  # a drift favours no cadence
            runs[every].append(tokens_per_sec(exp, every))
    best = {c: max(v) for c, v in runs.items()}
    top, top_median = max(best.values()), max(statistics.median(v) for v in runs.values())
    for every, v in runs.items():
        print(f"log_every={every:<4d} best {best[every]:10,.0f} tok/s, ratio to the fastest {best[every] / top:.3f} "
              f"(goal >= 0.97); median {statistics.median(v):10,.0f}, ratio {statistics.median(v) / top_median:.3f}")
    emit("slowest log_every / fastest (best tok/s)", min(best.values()) / top, ">= 0.97")


if __name__ == "__main__":
    main()
