"""Every recipe, shrunk (few steps), against `recipes/expected/NAME.json`.

Refresh the expectations on purpose with `STACK_RECORD=1 pytest tests/recipes`. They hold
across jax versions within `rtol` (jax 0.10.2 and 0.12 agree to ~1e-7, GRPO's sampled
completions included).
"""

import json
import os

import pytest

from stack.run import run
from stack.schema import objective_of, recipe_files
from tests.conftest import REPO, make_cfg, read_metrics

SHRINK = ["trainer.steps=20", "trainer.log_every=10", "trainer.eval_every=0", "trainer.eval_batches=2",
          "logger=jsonl", "warm_start.overrides=['trainer.steps=20','trainer.eval_batches=1']"]
RTOL = 0.02  # CPU runs are deterministic per jax version; this covers jax 0.10 vs 0.12 numerics


def tracked(cfg) -> tuple[str, ...]:
    """The metrics a recipe's regression compares: loss, gradient norm, its objective (+ reward)."""
    keys = ("train/loss", "train/grad_norm", objective_of(cfg))
    return keys + (("train/reward",) if cfg.data.kind == "prompt" else ())


def record(path: str, final: dict) -> None:
    with open(path, "w") as f:
        json.dump({"overrides": SHRINK, "rtol": RTOL, "metrics": final}, f, indent=2)
        f.write("\n")


@pytest.mark.parametrize("recipe", sorted(recipe_files()))
def test_recipe_matches_expected(recipe, tmp_path):
    path = os.path.join(REPO, "recipes", "expected", f"{recipe}.json")
    cfg = make_cfg([f"+recipe={recipe}", *SHRINK, f"run_dir={tmp_path}"])
    run(cfg)
    rows = read_metrics(tmp_path)
    final = {k: [r[k] for r in rows if k in r][-1] for k in tracked(cfg)}
    if os.environ.get("STACK_RECORD") == "1":
        record(path, final)
    expected = json.load(open(path))
    assert expected["overrides"] == SHRINK, "expectations were recorded with other overrides"
    for key, value in expected["metrics"].items():
        assert final[key] == pytest.approx(value, rel=expected["rtol"]), key


def test_every_recipe_has_expectations_and_a_header():
    for name, text in recipe_files().items():
        assert os.path.exists(os.path.join(REPO, "recipes", "expected", f"{name}.json")), name
        head = text.splitlines()
        assert head[0] == "# @package _global_" and any("python -m stack" in h for h in head[:6]), name


@pytest.mark.parametrize("recipe", sorted(recipe_files()))
def test_recipes_checkpoint_so_a_rerun_resumes(recipe):
    c = make_cfg([f"+recipe={recipe}"]).checkpoint
    assert c.name == "local" and c.resume == "auto" and c.every > 0
