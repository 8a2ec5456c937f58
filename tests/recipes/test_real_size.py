"""The real-size recipes (TPU targets) against `recipes/expected/NAME.json`: `mode=compile`'s
per-device memory and XLA FLOPs per step within their tolerance, fitting as recorded, the same
resolved config. Minutes of compiling each on 2 cores: marked slow and tpu_extra (CI runs them
in the venv with the tpu extra)."""

import json
import os

import pytest

from stack.recipe_compile import compare_compile, compiled_run, is_real_size
from stack.recipes import recipe_config
from stack.schema import recipe_files
from tests.conftest import REPO

REAL_SIZE = sorted(n for n in recipe_files() if is_real_size(recipe_config(n)))


@pytest.mark.slow
@pytest.mark.tpu_extra
@pytest.mark.parametrize("recipe", REAL_SIZE)
def test_real_size_recipe_compiles_as_expected(recipe):
    pytest.importorskip("libtpu", reason="TPU targets compile with libtpu (pip install -e '.[tpu]')")
    with open(os.path.join(REPO, "recipes", "expected", f"{recipe}.json")) as f:
        expected = json.load(f)
    assert expected["compile"]["fits"], f"{recipe} is recorded as not fitting its target"
    problems = compare_compile(expected, compiled_run(recipe))
    assert not problems, f"{recipe} differs from recipes/expected/{recipe}.json:\n" + "\n".join(problems)
