"""GRPO through the CLI: a kill -9 mid-run resumes with the same per-step rewards (RNG stream
and prompt position restored, across an epoch boundary of the prompts), and the warm start."""

import json

import pytest

from tests.helpers import REPO, read_metrics, run_cli
from tests.integration.test_resume import kill_at_step_and_rerun

PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in zip(range(20), range(3, 23), strict=True)]


def args(tmp_path, run_dir):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return ["data=jsonl_prompts", f"data.path={path}", f"data.eval_path={path}", "data.batch_size=8",
            "algorithm=grpo", "algorithm.num_generations=4", "algorithm.max_new_tokens=4", "trainer.steps=10",
            "trainer.log_every=1", "trainer.eval_every=0", "trainer.eval_batches=1", "checkpoint=local",
            "checkpoint.every=2", "logger=jsonl", f"run_dir={run_dir}"]


def rewards(run_dir) -> dict[int, float]:
    return {r["step"]: r["train/reward"] for r in read_metrics(run_dir) if "train/reward" in r}


@pytest.mark.slow  # ~20 s each: CI's slow tier; the main tier's kill-and-resume is test_resume.py's SFT run
@pytest.mark.parametrize("variant", ["on_policy", "dynamic_sampling", "paged", "env"])
def test_kill_9_during_grpo_resumes_with_the_same_rewards(tmp_path, variant):
    """With dynamic sampling a round reads 2 generation batches: the data position saved at a round's
    end is after both (issue 78 item 4). The paged engine (8 slots for 32 completions) too, and
    multi-turn rollouts (an environment that rewards each turn's length; its worker imports tests.*,
    so those runs start in the repository)."""
    dynamic, cwd = variant == "dynamic_sampling", str(REPO) if variant == "env" else str(tmp_path)
    extra = {"on_policy": [], "paged": ["rollout.engine=paged", "rollout.slots=8", "rollout.page_size=4"],
             "env": ["allow_targets=[tests.unit.env_fns]", "env.environment=tests.unit.env_fns.Chatter",
                     "env.max_turns=3", "algorithm.max_new_tokens=12", "reward.functions=[]"],
             "dynamic_sampling": ["reward.functions=[digits]", "algorithm.dynamic_sampling=true",
                                  "algorithm.max_generation_batches=2"]}[variant]
    reference = tmp_path / "reference"
    res = run_cli(args(tmp_path, reference) + extra, cwd=cwd)
    assert res.returncode == 0, res.stderr[-3000:]
    want = rewards(reference)
    assert sorted(want) == list(range(1, 11))
    epochs = [r["data/epoch"] for r in read_metrics(reference) if "data/epoch" in r]
    assert epochs[1] < 1 < epochs[2] if not dynamic else epochs[0] == 16 / 20  # 20 prompts, 8 per batch

    run_dir = tmp_path / "run"
    kill_at_step_and_rerun(args(tmp_path, run_dir) + extra, run_dir, 5, cwd, last=10)
    assert rewards(run_dir) == want  # exactly, step by step


@pytest.mark.slow  # main tier: a faster sibling covers it; CI runs the slow tier
def test_the_recipe_trains_its_warm_start_first_and_other_runs_reuse_it(tmp_path):
    """The stage is trained once into the shared dir of its key; the same command again and another
    run (PPO asks for the same stage) reuse it (issue 81 item 4)."""
    common = ["trainer.steps=2", "trainer.eval_every=0", "trainer.eval_batches=1", "data.batch_size=4",
              "logger=jsonl", "warm_start.overrides=['trainer.steps=3','trainer.eval_batches=1']",
              f"warm_start.dir={tmp_path}/warm"]
    cmd = ["+recipe=llama_grpo", "algorithm.num_generations=2", *common, f"run_dir={tmp_path}/run"]
    res = run_cli(cmd, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    (stage,) = (tmp_path / "warm").iterdir()
    assert f"warm start: +recipe=llama_sft in {stage} (model.init_from is not set)" in res.stdout
    assert f"({stage}); the run starts from it" in res.stdout
    warm = read_metrics(stage)
    assert max(r["step"] for r in warm) == 3 and "eval/loss" in warm[0]
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert f"init_from: {stage}/checkpoints" in saved and "name: llama_small" in saved
    res = run_cli(cmd, cwd=str(tmp_path))  # the same command again: nothing is retrained
    assert res.returncode == 0 and "resumed from" in res.stdout, res.stderr[-3000:]
    ppo = run_cli(["+recipe=llama_ppo", *common, "trainer.steps=4", f"run_dir={tmp_path}/ppo"], cwd=str(tmp_path))
    assert ppo.returncode == 0, ppo.stderr[-3000:]
    assert f"warm start: reusing +recipe=llama_sft from {stage} (trained earlier)" in ppo.stdout
    assert read_metrics(stage) == warm and len(list((tmp_path / "warm").iterdir())) == 1
