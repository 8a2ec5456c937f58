"""stack.engine.precompile: the first round's program compiles beside the model init; the trainer's first
step then compiles nothing, and trains bit for bit as programs made from the real model do."""

import threading
from dataclasses import replace

import jax
import numpy as np
import pytest

from stack.engine.trainer import Trainer
from stack.run.build import build
from tests.helpers import QUICK, captured, make_cfg, xla_compiles

ROUND = {"sft": "update", "dpo": "collect_update"}


def run(tmp_path, name: str, algorithm: str, precompiled: bool) -> tuple[list, list, object, dict]:
    """(rows, (thread, program) of each XLA compile during the run, final params, the summary's perf)."""
    (tmp_path / name).mkdir()
    cfg = make_cfg([f"+recipe=llama_{algorithm}", "checkpoint=none", *QUICK, "trainer.steps=2",
                    f"run_dir={tmp_path / name}"])
    with xla_compiles() as compiles:
        exp = build(cfg, str(tmp_path / name))
        assert exp.precompiled is not None  # eligible: one process, no quantization, a one-program round
        exp, cap = captured(exp if precompiled else replace(exp, precompiled=None))
        trainer = Trainer(exp)
        perf = trainer.run().perf
    rows = [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in cap.rows]
    return rows, compiles, jax.tree.map(np.asarray, trainer.state.params), perf


@pytest.mark.parametrize("algorithm", ["sft", "dpo"])
def test_the_round_program_compiles_in_the_thread_only_and_trains_the_same(tmp_path, algorithm):
    rows, compiles, params, perf = run(tmp_path, "pre", algorithm, precompiled=True)
    program = f"jit({ROUND[algorithm]})"
    assert ("stack-precompile", program) in compiles, compiles
    assert [c for c in compiles if c[1] == program] == [("stack-precompile", program)], compiles
    rows_own, compiles_own, params_own, perf_own = run(tmp_path, "own", algorithm, precompiled=False)
    assert ("MainThread", program) in compiles_own  # the reference path does compile it itself
    assert rows == rows_own and [r["step"] for r in rows if "train/loss" in r] == [1, 2]
    jax.tree.map(np.testing.assert_array_equal, params, params_own)
    # the run's compile time counts the thread's (the loop's own window no longer holds the compile)
    assert 0 < perf["precompile_seconds"] < perf["compile_seconds"] and perf_own["precompile_seconds"] == 0


def test_the_cpu_peak_is_probed_once_after_the_first_step_with_the_cores_to_itself(tmp_path, monkeypatch):
    """Not in build (in front of the first step), not beside the precompile thread's compile."""
    from stack.hardware import platform as hardware

    probes = []

    def probe(cache_file=None):
        probes.append([t.name for t in threading.enumerate()])
        return 4e10

    monkeypatch.setattr(hardware, "measure_cpu_peak", probe)
    cfg = make_cfg(["+recipe=llama_sft", "checkpoint=none", *QUICK, "trainer.steps=3", f"run_dir={tmp_path}"])
    exp, cap = captured(build(cfg, str(tmp_path)))
    assert probes == [] and exp.precompiled is not None
    summary = Trainer(exp).run()
    assert len(probes) == 1 and "stack-precompile" not in probes[0], probes
    assert summary.perf["peak_flops_per_device"] == 4e10
    row = cap.rows[-1]  # MFU = achieved FLOP/s / the probed peak
    assert row["perf/mfu"] == pytest.approx(row["perf/tflops_per_device"] * 1e12 / 4e10, rel=1e-9)
