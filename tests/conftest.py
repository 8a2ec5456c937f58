"""Shared fixtures: compose configs with the Compose API; run the CLI in a subprocess."""

import os
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_module

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_cfg(overrides: list[str] = ()):
    """The composed config for `overrides` (as `python -m stack` would compose it)."""
    with initialize_config_module("stack.conf", version_base=None):
        return compose("config", overrides=list(overrides))


def run_cli(args: list[str], cwd: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m stack ARGS` in a subprocess (quiet progress, offline wandb)."""
    full_env = {**os.environ, "WANDB_SILENT": "true", **(env or {})}
    return subprocess.run([sys.executable, "-m", "stack", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


class FixedLogits:
    """A stand-in model returning fixed logits, to test a loss in isolation."""

    def __init__(self, logits):
        import jax.numpy as jnp

        self.logits = jnp.asarray(logits)

    def __call__(self, inputs, positions=None, segment_ids=None):
        return self.logits


class Capture:
    """A sink that keeps every logged row as {"step": N, **metrics}."""

    def __init__(self):
        self.rows = []

    def log(self, step, metrics):
        self.rows.append({"step": step, **metrics})

    def close(self, summary=None):
        pass


@pytest.fixture
def cfg_factory():
    return make_cfg
