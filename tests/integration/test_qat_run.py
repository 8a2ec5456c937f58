"""Quantization-aware training through the CLI: a kill -9 mid-run resumes with the same per-step
losses, eval reports the fake-quantized and the float loss, DPO trains with QAT on an
8-device fsdp_tp mesh, and GRPO and PPO sample and train with it."""

import pytest

from tests.helpers import fake_devices, read_metrics, run_cli, train_losses
from tests.integration.test_resume import kill_at_step_and_rerun

INT4 = ["quantization=int4_qat", "quantization.rules.0.tile_size=16"]


def args(run_dir):
    return ["+recipe=llama_sft", *INT4, "trainer.steps=12", "trainer.log_every=1", "trainer.eval_every=6",
            "trainer.eval_batches=1", "data.batch_size=8", "checkpoint=local", "checkpoint.every=3",
            "logger=jsonl", f"run_dir={run_dir}"]


def test_qat_resumes_exactly_and_reports_float_and_quantized_eval(tmp_path):
    reference = tmp_path / "reference"
    res = run_cli(args(reference), cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    want = train_losses(reference)
    evals = [r for r in read_metrics(reference) if "eval/loss" in r]
    assert [r["step"] for r in evals] == [0, 6, 12]
    gaps = [abs(r["eval/loss"] - r["eval/float/loss"]) for r in evals]
    assert all(1e-4 < g < 0.5 for g in gaps), gaps  # int4 weights: visibly off float, not broken

    run_dir = tmp_path / "run"
    kill_at_step_and_rerun(args(run_dir), run_dir, 8, str(tmp_path), last=12)
    assert train_losses(run_dir) == want  # exactly, step by step


def test_dpo_with_qat_on_an_fsdp_tp_mesh(tmp_path):
    run_dir = tmp_path / "run"
    res = run_cli(["+recipe=llama_dpo", "quantization=int8_qat", "mesh=fsdp_tp", "trainer.steps=3",
                   "trainer.log_every=1", "trainer.eval_every=3", "trainer.eval_batches=1", "data.batch_size=8",
                   "logger=jsonl", f"run_dir={run_dir}"], cwd=str(tmp_path), env=fake_devices(8))
    assert res.returncode == 0, res.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert len(train_losses(run_dir)) == 3
    last = [r for r in rows if "eval/rewards/accuracies" in r][-1]
    assert "eval/float/rewards/accuracies" in last and last["step"] == 3


ON_POLICY = {
    "grpo": ["algorithm=grpo", "algorithm.num_generations=4"],
    "ppo": ["algorithm=ppo", "algorithm.num_ppo_epochs=2", "reward=arithmetic"],
}


@pytest.mark.parametrize("algorithm", sorted(ON_POLICY))
def test_on_policy_algorithms_sample_and_train_with_qat(tmp_path, algorithm):
    """The rollout runs the fake-quantized policy (one intercepted __call__); no float/* eval:
    the eval completions were sampled by the quantized policy."""
    run_dir = tmp_path / "run"
    res = run_cli([*ON_POLICY[algorithm], "data=jsonl_prompts", "quantization=int8_qat", "algorithm.max_new_tokens=4",
                   "data.batch_size=8", "trainer.steps=2", "trainer.log_every=1", "trainer.eval_every=2",
                   "trainer.eval_batches=1", "logger=jsonl", f"run_dir={run_dir}"], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows if "train/reward" in r] == [1, 2]
    assert [r["step"] for r in rows if "eval/reward" in r] == [0, 2]
    assert not [k for r in rows for k in r if k.startswith("eval/float/")]
