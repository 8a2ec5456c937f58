"""Every small (CPU) recipe, shrunk (stack.tools.expectations.SHRINK), against `recipes/expected/NAME.json`: per-step
loss, gradient norm, objective (and reward) within a per-metric tolerance, no systematic drift,
and the same resolved config. A failure prints step, metric, expected, got and tolerance, and
names a version or machine change. Re-record on purpose: `python -m stack.tools.recipes record NAME`.
"""

import json
import os

import pytest

from stack.config.schema import recipe_files
from stack.tools.expectations import compare, shrunk_run
from tests.helpers import REPO, make_cfg, recipe_platforms

SMALL = [n for n, p in recipe_platforms().items() if p == "cpu"]  # real size (is_real_size): test_real_size.py
# variants of llama_grpo, checked in the default tier, run in the slow tier (~40-50 s of CPU each): qwen3_grpo (its
# round with a Qwen3; the family is checked against transformers in the default tier) and llama_grpo_dapo (DAPO's
# loss, dynamic sampling and overlong penalty; their formulas are unit-tested there), and llama_grpo_tools (the
# multi-turn rollouts of tests/unit/test_env.py with the calculator). Their 20-step runs agree to 5 digits at -O0
# and XLA's -O1, the two tiers' flags.
VARIANTS = {"qwen3_grpo", "llama_grpo_dapo", "llama_grpo_tools"}


@pytest.mark.parametrize("recipe", [pytest.param(n, marks=pytest.mark.slow) if n in VARIANTS else n for n in SMALL])
def test_recipe_matches_expected(recipe, tmp_path):
    with open(os.path.join(REPO, "recipes", "expected", f"{recipe}.json")) as f:
        expected = json.load(f)
    problems = compare(expected, shrunk_run(recipe, str(tmp_path)))
    assert not problems, f"{recipe} differs from recipes/expected/{recipe}.json:\n" + "\n".join(problems)


def test_every_recipe_has_expectations_and_a_header():
    for name, text in recipe_files().items():
        assert os.path.exists(os.path.join(REPO, "recipes", "expected", f"{name}.json")), name
        head = text.splitlines()
        assert head[0] == "# @package _global_" and any("python -m stack" in h for h in head[:6]), name


@pytest.mark.parametrize("recipe", sorted(recipe_files()))
def test_recipes_checkpoint_so_a_rerun_resumes(recipe):
    c = make_cfg([f"+recipe={recipe}"]).checkpoint
    assert c.name == "local" and c.resume == "auto" and c.every > 0
