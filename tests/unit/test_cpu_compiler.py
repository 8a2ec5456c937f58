"""stack.hardware.cpu_compiler: the LLVM level a CPU run adds to XLA_FLAGS, and that it is added in time."""

import os
import subprocess
import sys

import pytest

from stack.hardware.cpu_compiler import configure_cpu_compiler
from tests.helpers import REPO, make_cfg


@pytest.mark.parametrize("flags, overrides, expected", [
    ("", [], "--xla_backend_optimization_level=1"),
    ("--xla_cpu_multi_thread_eigen=false", [], "--xla_cpu_multi_thread_eigen=false --xla_backend_optimization_level=1"),
    ("--xla_backend_optimization_level=0", [], "--xla_backend_optimization_level=0"),  # the user's level wins
    ("", ["hardware=gpu_h100"], ""),  # not a CPU target: untouched
])
def test_level_added_for_cpu_targets_only(monkeypatch, flags, overrides, expected):
    monkeypatch.setenv("XLA_FLAGS", flags)
    configure_cpu_compiler(make_cfg(overrides))
    assert os.environ["XLA_FLAGS"] == expected


def test_flags_set_after_the_cli_imports_reach_xla(tmp_path):
    """run() sets the level after the CLI's imports: none of them may compile (XLA reads its flags
    at the first compile), or the level would be silently ignored. Observed with a dump flag."""
    script = ("import os, sys; import stack.run.modes, stack.cli.app; "
              "os.environ['XLA_FLAGS'] = '--xla_dump_to=' + sys.argv[1]; "
              "import jax, jax.numpy as jnp; jax.jit(lambda x: x * 2)(jnp.ones(3))")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, cwd=REPO, env=env)
    assert any(name.endswith(".txt") for name in os.listdir(tmp_path))
