"""Session set-up (the shared compilation cache, the default tier's XLA flags, the bench scripts on
the import path) and fixtures. Helpers live in tests/helpers.py."""

import os
import sys
import tempfile

import pytest

from tests.helpers import REPO, make_cfg

# Tests share compiled programs through jax's persistent compilation cache (this process, the
# xdist workers and every subprocess inherit it): most tests compile the same tiny programs.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "stack-tests-xla-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

# The default tier (the mark expression of pyproject's addopts) mostly compiles tiny programs: it
# compiles them with LLVM at -O0 (XLA:CPU's default is -O2; set in pytest_configure, before any test
# module imports jax). XLA's HLO passes do not read the level (a DPO step's optimized HLO is the same
# text); the machine code runs slower (a tiny step ~2x) and may differ in last bits, within the recipe
# tolerances (expectations are recorded at -O2). On a fresh machine the tier took 809 s at -O2 and
# 625-663 s at -O0; on a warm cache 429 and 471 s. The tiers of long runs (slow) and of other
# backends' compilers (tpu_extra, gpu_extra) keep XLA's defaults. Eigen's ops (the matmuls) run on the
# calling thread: two xdist workers on two cores had them split over threads that contend for the
# cores (a subset of 78 tests, warm cache: 56.4-57.8 s -> 52.0-54.1 s).
DEFAULT_TIER_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false"


def pytest_configure(config: pytest.Config) -> None:
    addopts = config.getini("addopts")  # split as a command line is
    if "-m" in addopts and config.option.markexpr == addopts[addopts.index("-m") + 1]:
        if DEFAULT_TIER_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):  # an xdist worker inherits it
            os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {DEFAULT_TIER_XLA_FLAGS}".strip()

# The bench scripts import each other as top-level modules (`from rows import emit`), as they do run
# as scripts from bench/: tests of their helpers import them the same way.
sys.path.append(os.path.join(REPO, "bench"))


@pytest.fixture
def cfg_factory():
    return make_cfg
