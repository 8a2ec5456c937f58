"""Helpers the tests share (import them from here, `from tests.helpers import ...`): composing
configs, the shrink overrides, reading metrics.jsonl, fake devices, running the CLI (integration
tests only), stand-in models and sinks, and watching XLA compiles."""

import contextlib
import functools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from types import SimpleNamespace

from hydra import compose, initialize_config_module

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Few steps, one small eval, metrics.jsonl only: the shrink every test run starts from.
QUICK = ["trainer.log_every=1", "trainer.eval_every=0", "trainer.eval_batches=1", "logger=jsonl",
         "data.batch_size=8"]


@functools.cache
def recipe_platforms() -> dict[str, str]:
    """Recipe name -> `hardware.platform` as its expectation (recipes/expected/NAME.json) recorded
    it, to parametrize the recipe tests without composing 13 recipes at collection (~0.8 s each, in
    every xdist worker). A recipe without an expectation counts as a CPU one: test_recipes then fails
    on its missing file; a platform changed since recording fails that test's config comparison."""
    from stack.config.schema import recipe_files

    platforms = {}
    for name in sorted(recipe_files()):
        path = os.path.join(REPO, "recipes", "expected", f"{name}.json")
        if not os.path.exists(path):
            platforms[name] = "cpu"
            continue
        with open(path) as f:
            platforms[name] = json.load(f)["config"]["hardware.platform"]
    return platforms


def fake_devices(n: int = 8) -> dict[str, str]:
    """Environment of a subprocess whose jax sees `n` CPU devices (the run's other XLA flags kept)."""
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    return {**os.environ, "XLA_FLAGS": " ".join([*kept, f"--xla_force_host_platform_device_count={n}"])}


def make_cfg(overrides: list[str] = ()):
    """The composed config for `overrides` (as `python -m stack` would compose it)."""
    with initialize_config_module("stack.conf", version_base=None):
        return compose("config", overrides=list(overrides))


def read_metrics(run_dir) -> list[dict]:
    """The rows of a run's metrics.jsonl."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def train_losses(run_dir) -> dict[int, float]:
    """step -> train/loss of a run (each step logged once)."""
    rows = [r for r in read_metrics(run_dir) if "train/loss" in r]
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), "a step was logged twice"
    return {r["step"]: r["train/loss"] for r in rows}


def tensorboard_scalars(log_dir, tag: str) -> dict[int, float]:
    """step -> value of scalar `tag` as TensorBoard reads the event files in `log_dir` (its purge of
    orphaned steps included)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # only its tests

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


def run_cli(args: list[str], cwd: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m stack ARGS` in a subprocess (quiet progress, offline wandb)."""
    full_env = {**os.environ, "WANDB_SILENT": "true", **(env or {})}
    return subprocess.run([sys.executable, "-m", "stack", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@functools.cache
def _jitted_call():
    from flax import nnx

    return nnx.jit(lambda model, *args: model(*args))


def forward(model, *args):
    """`model(*args)` as one compiled program (called op by op, each operation compiles on its own:
    seconds per new shape on a cold compilation cache)."""
    return _jitted_call()(model, *args)


def assert_same_vjp(fn, reference, args, cotangents) -> None:
    """`fn`'s hand-written backward at `args` equals autodiff of `reference` (rtol and atol 1e-5);
    every reference gradient reaches 0.1, so the tolerance is a real one."""
    import jax
    import numpy as np

    got = jax.vjp(fn, *args)[1](cotangents)
    want = jax.vjp(reference, *args)[1](cotangents)
    assert all(np.abs(np.asarray(w)).max() > 0.1 for w in want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


class FixedLogits:
    """A stand-in model returning fixed logits, to test a loss in isolation."""

    def __init__(self, logits):
        import jax.numpy as jnp

        self.logits = jnp.asarray(logits)

    def __call__(self, inputs, positions=None, segment_ids=None):
        return self.logits


def models(policy, **others):
    """What an algorithm's functions receive as `models` / `frozen`: modules by name."""
    return SimpleNamespace(policy=policy, **others)


def loss_of(algorithm, policy, batch, frozen=None, state=()):
    """(loss value, metrics) of `algorithm.loss` on one micro-batch."""
    import jax

    from stack.algorithms.base import ratio

    terms, metrics = algorithm.loss(models(policy), batch, frozen, state, jax.random.key(0))
    return ratio(terms), metrics


class Capture:
    """A sink that keeps every logged row as {"step": N, **metrics}."""

    def __init__(self):
        self.rows = []

    def log(self, step, metrics):
        self.rows.append({"step": step, **metrics})

    def rewind(self, step):
        self.rows = [r for r in self.rows if r["step"] <= step]

    def close(self, summary=None):
        pass


def captured(exp):
    """`exp` logging into a Capture sink only: (experiment, sink)."""
    from dataclasses import replace

    sink = Capture()
    return replace(exp, sinks=(sink,)), sink


@contextlib.contextmanager
def xla_compiles() -> Iterator[list[tuple[str, str]]]:
    """Within the block, each XLA compile (or load from the persistent cache) as (thread name, program),
    from jax's backend_compile_duration event."""
    import jax

    compiles: list[tuple[str, str]] = []

    def listener(event: str, secs: float, fun_name: str = "", **_) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append((threading.current_thread().name, fun_name))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
