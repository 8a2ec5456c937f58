"""Does the logging cadence slow the step? Whole-run steady-state tokens/s of the tiny SFT
recipe (real Grain data) at `trainer.log_every` 1, 10 and 100, interleaved trials in one
process (odd trials in the reverse order); each cadence's median over the fastest's. Goal: every
cadence within 3 % (>= 0.97).

    python bench/log_every.py [--trials 4] [--steps 200]
    python bench/log_every.py --quick        # one trial of 60 steps
"""

import argparse
import statistics

from rows import emit  # bench/ is on sys.path when run as a script
from step_overhead import Capture, experiment, fresh

from stack.trainer import Trainer

CADENCES = (1, 10, 100)


def tokens_per_sec(exp, every: int) -> float:
    """The run's steady-state tokens/s (the compiling first step left out) at `log_every=every`."""
    exp.cfg.trainer.log_every = every
    return Trainer(fresh(exp, sinks=(Capture(),))).run().perf["perf/tokens_per_sec"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="one trial of 60 steps")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.steps = 1, 60
    exp = experiment(["+recipe=llama_sft", "checkpoint=none", f"trainer.steps={args.steps}"])
    tokens_per_sec(exp, 1)  # warm-up: every program compiled once
    runs: dict[int, list[float]] = {c: [] for c in CADENCES}
    for trial in range(args.trials):
        for every in CADENCES if trial % 2 == 0 else CADENCES[::-1]:  # a drift favours no cadence
            runs[every].append(tokens_per_sec(exp, every))
    medians = {c: statistics.median(v) for c, v in runs.items()}
    best = max(medians.values())
    for every, median in medians.items():
        print(f"log_every={every:<4d} {median:10,.0f} tok/s  ratio to the fastest {median / best:.3f} (goal >= 0.97)")
    emit("slowest log_every / fastest (tok/s)", min(medians.values()) / best, ">= 0.97")


if __name__ == "__main__":
    main()
