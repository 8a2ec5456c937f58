"""The benches' fixed-batch feeder (bench/step_overhead.py `Fixed`) keeps the trainer's data
protocol: bench/dpo_step.py and bench/tunix_dpo.py run the real trainer on it, also with
precomputed reference columns (a protocol change once made that bench crash unnoticed)."""

import math
from dataclasses import replace

import pytest
from step_overhead import Capture, Fixed, experiment, fresh  # bench/, on the path by conftest.py

from stack.engine.trainer import Trainer


@pytest.mark.parametrize("precompute", [False, True])
def test_a_fixed_pair_batch_trains_dpo_from_log_2(precompute):
    """At step 1 the policy is the reference, so every margin is 0 and the sigmoid loss is
    ln 2 (TRL DPOTrainer, loss_type=sigmoid, label_smoothing 0), precomputed or not."""
    exp = experiment(["model=llama_tiny", "data=jsonl_prefs", "algorithm=dpo", "data.seq_len=64", "data.batch_size=4",
                      "trainer.steps=2", f"algorithm.precompute_reference={str(precompute).lower()}"])
    exp.cfg.trainer.log_every = 1
    sink = Capture()
    Trainer(replace(fresh(exp, sinks=(sink,)), train_batches=Fixed(exp.eval_batches[0]))).run()
    losses = [row["train/loss"] for row in sink.rows if "train/loss" in row]
    assert len(losses) == 2 and losses[0] == pytest.approx(math.log(2), rel=1e-6)
