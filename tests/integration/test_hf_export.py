"""A trained run's checkpoint -> `python -m stack.hf export` -> transformers loads it with the
same logits -> `model.init_from=hf:DIR` starts a run from it with the same eval loss."""

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the reference needs torch (pip install -e '.[hf]', Python 3.11)")
transformers = pytest.importorskip("transformers", reason="the reference needs transformers (the hf extra)")

from stack.checkpoint import load_params  # noqa: E402
from stack.models.llama import init_model  # noqa: E402
from tests.conftest import make_cfg, run_cli  # noqa: E402

RUN = ["+recipe=llama_sft", "trainer.log_every=5", "trainer.eval_every=0", "trainer.eval_batches=2",
       "data.batch_size=8", "logger=jsonl"]


def test_export_loads_in_transformers_and_imports_back(tmp_path):
    a = tmp_path / "a"
    res = run_cli(RUN + ["trainer.steps=10", "checkpoint=local", f"run_dir={a}"], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    out = tmp_path / "hf"
    exported = subprocess.run([sys.executable, "-m", "stack.hf", "export", str(a / "checkpoints"), "--out", str(out)],
                              capture_output=True, text=True)
    assert exported.returncode == 0, exported.stderr
    assert "exported step 10" in exported.stdout and (out / "config.json").exists()

    cfg = make_cfg(RUN)
    ours = init_model(cfg.model, 1)
    assert load_params(ours, str(a / "checkpoints")) == 10
    tokens = np.random.default_rng(0).integers(0, cfg.model.vocab_size, size=(2, 24))
    theirs = transformers.LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        want = theirs(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours(tokens)), want, atol=1e-4)

    b = tmp_path / "b"
    res = run_cli(RUN + ["trainer.steps=1", f"model.init_from=hf:{out}", f"run_dir={b}"], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    final_a = [json.loads(x) for x in open(a / "metrics.jsonl")][-1]["eval/loss"]
    start_b = json.loads(open(b / "metrics.jsonl").readline())["eval/loss"]
    assert start_b == pytest.approx(final_a, rel=1e-5)
