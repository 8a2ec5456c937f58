"""Data pipeline throughput, and how long the training loop waits for data.

    python bench/data_pipeline.py
    python bench/data_pipeline.py --quick    # part 2 only, in one process, 48 steps per run

1. examples/s of read + tokenize (+ pack) + batch over the shipped SFT sample, with the
   default background-thread prefetch, with 2 Grain worker processes, and packed (also from
   its Parquet copy: 8 row groups read in shuffled order). Long context: tokens/s of the same
   over written long records (up to T bytes each) at T = 1,024, 8,192 and 32,768, unpacked and
   packed; the per-token cost must not grow with T (row: tokens/s at 32,768 over 1,024).
2. On the tiny SFT recipe, as the loop measures it: the fraction of step time the device may
   have waited for data (`perf/data_wait_fraction`: reads that ended after the device ran out
   of dispatched work; goal < 2 %), the fraction the host spent reading while the device ran
   (`perf/data_read_fraction`), and the step time over that of the same loop fed one fixed
   batch (the control). Also at 8,192 tokens a row (packed long records, 1 row a step).

On a CPU "device" the tokenizer and XLA share the cores: reading (and packing, in Grain's
Python packer) takes cycles from the step, which the control ratio shows and an accelerator
host, whose cores are free, would not pay.
"""

import argparse
import json
import os
import random
import tempfile
import time
from dataclasses import replace

import jax
import numpy as np
from hydra import compose, initialize_config_module
from rows import emit  # bench/ is on sys.path when run as a script
from step_overhead import Capture, Fixed

from stack.data.pipeline import Batches
from stack.data.tokenizers import ByteTokenizer
from stack.engine.trainer import train
from stack.run.build import build


def config(overrides: list[str]):
    with initialize_config_module("stack.conf", version_base=None):
        return compose("config", overrides=["+recipe=llama_sft", "checkpoint=none", *overrides])


def examples_per_second(overrides: list[str], batches: int = 300) -> float:
    cfg = config(overrides)
    data = Batches(cfg.data, ByteTokenizer(), "train", 0, cfg.data.batch_size)
    it = iter(data)
    next(it)  # start-up (worker processes, first reads) is not throughput
    start_state, start = it.get_state(), time.perf_counter()
    for _ in range(batches):
        next(it)
    seconds = time.perf_counter() - start
    records = (data.epoch(it.get_state()) - data.epoch(start_state)) * data.records
    it.close()
    return records / seconds


def long_records(t: int, n: int = 64) -> str:
    """A JSONL file of `n` prompt/completion records of T/4 + up to T bytes (letters and spaces)."""
    rnd, path = random.Random(t), os.path.join(tempfile.mkdtemp(), f"long{t}.jsonl")
    text = lambda k: "".join(rnd.choice("abcdefgh ") for _ in range(k))  # noqa: E731
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"prompt": text(t // 4), "completion": text(rnd.randint(t // 4, t))}) + "\n")
    return path


def long_tokens_per_second(t: int, packing: bool, seconds: float = 3.0) -> float:
    """Tokens/s (row slots) of read + tokenize (+ pack) + batch over long records at seq_len T."""
    path = long_records(t)
    cfg = config([f"data.path={path}", f"data.eval_path={path}", f"data.seq_len={t}", f"data.packing={packing}",
                  "data.batch_size=2", "data.prefetch=0"])
    it = iter(Batches(cfg.data, ByteTokenizer(), "train", 0, 2))
    next(it)  # start-up
    tokens, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        tokens += next(it)["inputs"].size
    return tokens / (time.perf_counter() - start)


def data_wait(overrides: list[str], steps: int, fixed: bool = False) -> tuple[float, float, float]:
    """Mean perf/data_wait_fraction and perf/data_read_fraction, and the median step time of
    the tiny recipe (after compile).

    `fixed`: feed one batch forever instead (the control: no data work at all).
    """
    cfg = config([f"trainer.steps={steps}", f"trainer.log_every={steps // 6}", "trainer.eval_every=0", "logger=jsonl",
                  *overrides])
    exp = build(cfg, tempfile.mkdtemp())
    capture = Capture()
    exp = replace(exp, sinks=(capture,), **({"train_batches": Fixed(exp.eval_batches[0])} if fixed else {}))
    train(exp)
    rows = [r for r in capture.rows if "perf/step_seconds" in r]
    mean = lambda key: float(np.mean([r[key] for r in rows]))  # noqa: E731
    step = float(np.median([r["perf/step_seconds"] for r in rows]))
    return mean("perf/data_wait_fraction"), mean("perf/data_read_fraction"), step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the loop's data wait in one process, 48 steps a run")
    args = parser.parse_args()
    steps = 48 if args.quick else 300
    print(f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} device(s)")
    for label, overrides in [] if args.quick else [("prefetch thread", []), ("2 worker processes", ["data.workers=2"]),
                             ("packed, prefetch thread", ["data.packing=true"]),
                             ("Parquet, packed", ["data=parquet_sft", "data.packing=true"]),
                             ("packed, 2 workers", ["data.packing=true", "data.workers=2"])]:
        print(f"tokenize+batch {label:26s} {examples_per_second(overrides):10,.0f} examples/s")
    speeds = {}
    for t in (1024, 8192, 32768):
        for packing in (False, True):
            speeds[t, packing] = long_tokens_per_second(t, packing)
            label = f"T={t:,d}{', packed' if packing else ''}"
            print(f"long records, {label:16s} {speeds[t, packing] / 1e6:7.2f} M tokens/s")
    for packing in (False, True):
        emit(f"tokens/s at T=32,768 / at T=1,024{' (packed)' if packing else ''}",
             speeds[32768, packing] / speeds[1024, packing], ">= 0.9")
    long = long_records(8192)
    wait, read, step = data_wait([f"data.path={long}", f"data.eval_path={long}", "data.seq_len=8192",
                                  "data.packing=true", "data.batch_size=1"], 12)
    print(f"tiny recipe at 8,192 tokens, packed: the device waits for data {wait:6.2%} of step time, the host "
          f"reads {read:6.2%} of it; step {step * 1e3:.0f} ms")
    emit("data wait / step time (tiny recipe, 8,192 tokens packed)", wait, "< 0.02")
    *_, fixed_step = data_wait([], steps, fixed=True)
    workers = [] if args.quick else [("tiny recipe, 2 workers", ["data.workers=2"])]
    for label, overrides in [("tiny recipe", []), ("tiny recipe, packed", ["data.packing=true"]), *workers]:
        wait, read, step = data_wait(overrides, steps)
        print(f"{label:24s} the device waits for data {wait:6.2%} of step time (goal < 2 %), the host reads "
              f"{read:6.2%} of it; step {step * 1e3:.2f} ms = {step / fixed_step:.3f} x the step fed one fixed batch")
        emit(f"data wait / step time ({label})", wait, "< 0.02")


if __name__ == "__main__":
    main()
