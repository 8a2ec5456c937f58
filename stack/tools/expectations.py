"""A recipe's expectation (`recipes/expected/NAME.json`): the recipe shrunk by SHRINK, the per-step
values of its tracked metrics (loss, gradient norm, objective, GRPO/PPO reward), a tolerance per
metric, a snapshot of the resolved config (so a changed default shows in review), and the versions
and machine it was recorded with (a mismatch is named when a comparison fails).
`tests/recipes/test_recipes.py` compares every recipe against it (`compare`).
"""

import json
import os
import platform
import re
from importlib.metadata import version
from importlib.resources import files
from typing import Any

from hydra import compose, initialize_config_module
from omegaconf import DictConfig, OmegaConf

from stack.config.schema import CONFIG_MODULE, objective_of

SHRINK = ["trainer.steps=20", "trainer.log_every=5", "trainer.eval_every=10", "trainer.eval_batches=2",
          "logger=jsonl", "warm_start.overrides=['trainer.steps=20','trainer.eval_batches=1']"]
RTOL = 0.02  # per step: CPU runs are deterministic per jax version; this covers jax 0.10 vs 0.12
MEAN_RTOL = 0.005  # the mean signed residual over steps: a small systematic drift fails
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "qwix")


def expected_dir() -> str:
    """The folder of the recipes' expectations (recipes/expected, shipped as stack.conf.recipe.expected)."""
    return str(files(f"{CONFIG_MODULE}.recipe").joinpath("expected"))


def recipe_config(name: str, overrides: list[str] = ()) -> DictConfig:
    """The composed config of `+recipe=name` with `overrides`."""
    with initialize_config_module(CONFIG_MODULE, version_base=None):
        return compose("config", overrides=[f"+recipe={name}", *overrides])


def tracked(cfg: DictConfig) -> tuple[str, ...]:
    """The metrics a recipe's regression compares: loss, gradient norm, its objective (+ reward; with an
    environment the trajectories' model turns and lengths, which 20 steps from a 20-step warm start
    move when the rewards are still all 0)."""
    keys = ("train/loss", "train/grad_norm", objective_of(cfg))
    keys += ("train/reward",) if cfg.data.kind == "prompt" else ()
    return keys + (("train/env/turns", "train/completions/mean_length") if cfg.env.environment else ())


def snapshot(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as dotted keys, machine-independent (shipped files by name, no run dir),
    without `logger` (where metrics go changes none of them)."""
    flat: dict[str, Any] = {}

    shipped = re.compile(r"/\S*/(?:recipes|conf/recipe)/data/")  # a shipped file, by name
    plain = lambda v: shipped.sub("<shipped>/", v) if isinstance(v, str) else v  # noqa: E731

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            flat[prefix[:-1]] = [plain(v) for v in node] if isinstance(node, list) else plain(node)

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    flat.pop("run_dir", None)
    flat.pop("warm_start.dir", None)
    return {k: v for k, v in flat.items() if not k.startswith("logger.")}


def machine() -> dict[str, str]:
    """The versions and machine numbers depend on."""
    return {"python": platform.python_version(), **{p: version(p) for p in PACKAGES},
            "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cpus"}


def shrunk_run(name: str, run_dir: str) -> dict[str, Any]:
    """Run the recipe shrunk by SHRINK into `run_dir`: its expectation (as `record` writes it)."""
    from stack.run.modes import run  # jax and the whole run: off the catalogue's light path

    cfg = recipe_config(name, [*SHRINK, f"run_dir={run_dir}", f"warm_start.dir={run_dir}/warm_starts"])  # no reuse
    run(cfg)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    steps = {k: {str(r["step"]): r[k] for r in rows if k in r} for k in tracked(cfg)}
    return {"recorded_with": machine(), "overrides": SHRINK, "tolerance": {k: RTOL for k in steps},
            "mean_tolerance": MEAN_RTOL, "steps": steps, "config": snapshot(cfg)}


def compare(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Readable differences of a run from its expectation; [] when it holds."""
    if expected.get("overrides") != got["overrides"]:
        return [f"the expectation was recorded with other overrides: {expected.get('overrides')} (now {SHRINK})"]
    rows, drift = [], []
    for metric, want in expected["steps"].items():
        have, tol = got["steps"].get(metric, {}), expected["tolerance"][metric]
        residuals = []
        for step, value in want.items():
            new = have.get(step)
            rel = abs(new - value) / max(abs(value), 1e-8) if new is not None else float("inf")
            residuals.append((new - value) / max(abs(value), 1e-8) if new is not None else 0.0)
            if rel > tol:
                rows.append(f"  {step:>5}  {metric:<28} {value:>12.6g} {_g(new):>12}  {tol:g}")
        mean = sum(residuals) / max(len(residuals), 1)
        if abs(mean) > expected["mean_tolerance"]:
            drift.append(f"{metric}: mean relative residual {mean:+.4f} over {len(residuals)} steps "
                         f"(allowed {expected['mean_tolerance']:g})")
    out = ([f"  {'step':>5}  {'metric':<28} {'expected':>12} {'got':>12}  rtol", *rows] if rows else []) + drift
    out += config_changes(expected, got)
    return out + version_note(expected, got) if out else out


def config_changes(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """The resolved-config keys that differ from the expectation's snapshot, one line each; a key
    added since the recording counts as unchanged while it is null or false (a new option, off:
    the rule a resume applies, stack.checkpoint.manager.config_diff)."""
    from stack.checkpoint.manager import config_diff  # Orbax: off the catalogue's light path

    changed = [f"  {line}" for line in config_diff(expected["config"], got["config"])]
    return ["the resolved config changed (re-record if intended):", *changed] if changed else []


def version_note(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """A line naming the versions or machine that differ from the recording's (none if equal)."""
    if expected["recorded_with"] == got["recorded_with"]:
        return []
    diff = {k: f"{v} -> {got['recorded_with'].get(k)}" for k, v in expected["recorded_with"].items()
            if got["recorded_with"].get(k) != v}
    return [f"recorded with other versions or another machine ({diff}): numbers may move across "
            "them; re-record with python -m stack.tools.recipes record NAME when the change is expected."]


def _g(x: float | None) -> str:
    return "missing" if x is None else f"{x:.6g}"
