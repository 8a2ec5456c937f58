"""`python -m stack.tools.quantize` end to end: a trained SFT run quantized W8A8 with calibrated static
activation scales, its report on disk, and `python -m stack.tools.generate` sampling from the
quantized checkpoint."""

import json
import subprocess
import sys

import pytest

from tests.helpers import run_cli


def _module(name: str, args: list[str], cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", name, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # main tier: a faster sibling covers it; CI runs the slow tier
def test_quantize_a_run_report_and_generate_from_it(tmp_path):
    run = tmp_path / "sft"
    res = run_cli(["+recipe=llama_sft", "trainer.steps=20", "trainer.eval_every=0", "trainer.eval_batches=1",
                   "checkpoint=local", "logger=jsonl", f"run_dir={run}"], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    out = tmp_path / "w8a8"
    res = _module("stack.tools.quantize", [str(run / "checkpoints"), "quantization=w8a8_ptq", "trainer.eval_batches=2",
                                     "--calibration-batches", "2", "--out", str(out)], str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "top-1 agreement" in res.stdout and "quantized" in res.stdout
    report = json.loads((out / "ptq_report.json").read_text())
    assert report["step"] == 20 and report["calibration_batches"] == 2
    assert 0.5 < report["top1_agreement"] <= 1.0 and report["mean_abs_logit_delta"] > 0
    assert report["weight_bytes_quantized"] < 0.6 * report["weight_bytes_float"]
    assert len(report["activation_scales"]) == 14 and min(report["activation_scales"].values()) > 0
    assert (out / "checkpoints" / "20").is_dir() and (out / "config.yaml").is_file()

    res = _module("stack.tools.generate", [str(out / "checkpoints"), "--prompt", "12+7=", "--greedy",
                                     "--max-new-tokens", "3"], str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.startswith("12+7=")

    res = _module("stack.tools.quantize", [str(run / "checkpoints"), "quantization=w8_ptq", "--out", str(out)],
                  str(tmp_path))
    assert res.returncode == 2 and "already exists and is not empty" in res.stderr
    assert json.loads((out / "ptq_report.json").read_text()) == report  # the first run's output untouched
    res = _module("stack.tools.quantize", [str(run / "checkpoints"), "quantization=w8_ptq", "trainer.eval_batches=2",
                                     "--calibration-batches", "2", "--out", str(out), "--overwrite"], str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((out / "ptq_report.json").read_text())["quantization"] == "w8_ptq"
    assert not [p for p in out.parent.iterdir() if ".partial-" in p.name or ".old-" in p.name]
