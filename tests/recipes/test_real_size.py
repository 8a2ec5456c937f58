"""The real-size recipes (TPU and GPU targets) against `recipes/expected/NAME.json`: `mode=compile`'s
per-device memory and XLA FLOPs per step within their tolerance, fitting as recorded, the same
resolved config. Minutes of compiling each on 2 cores: marked slow and tpu_extra or gpu_extra
(CI runs them in the venvs with the tpu and the gpu-aot extra)."""

import json
import os

import pytest

from stack.hardware.gpu_target import plugin_installed
from stack.tools.recipe_compile import compare_compile, compiled_run
from tests.helpers import REPO, recipe_platforms

PLATFORMS = {n: p for n, p in recipe_platforms().items() if p != "cpu"}  # real size (is_real_size)
EXTRA = {"tpu": pytest.mark.tpu_extra, "gpu": pytest.mark.gpu_extra}  # the venv that compiles for it
REAL_SIZE = [pytest.param(n, marks=EXTRA[p]) for n, p in PLATFORMS.items()]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", REAL_SIZE)
def test_real_size_recipe_compiles_as_expected(recipe):
    if PLATFORMS[recipe] == "gpu" and not plugin_installed():
        pytest.skip("GPU targets compile with the CUDA plugin (pip install -e '.[gpu-aot]')")
    if PLATFORMS[recipe] == "tpu":
        pytest.importorskip("libtpu", reason="TPU targets compile with libtpu (pip install -e '.[tpu]')")
    with open(os.path.join(REPO, "recipes", "expected", f"{recipe}.json")) as f:
        expected = json.load(f)
    assert expected["compile"]["fits"], f"{recipe} is recorded as not fitting its target"
    problems = compare_compile(expected, compiled_run(recipe))
    assert not problems, f"{recipe} differs from recipes/expected/{recipe}.json:\n" + "\n".join(problems)
