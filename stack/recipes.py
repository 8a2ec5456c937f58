"""`python -m stack.recipes`: the recipe catalogue and its expectations.

    python -m stack.recipes                      # name, algorithm, model, hardware, runtime: a line each
    python -m stack.recipes llama_grpo           # its header, resolved choices, expected metrics
    python -m stack.recipes record llama_dpo     # re-record recipes/expected/llama_dpo.json (clean tree only)

An expectation (`recipes/expected/NAME.json`) is the recipe shrunk by SHRINK: the per-step
values of its tracked metrics (loss, gradient norm, objective, GRPO/PPO reward), a tolerance
per metric, a snapshot of the resolved config (so a changed default shows in review), and the
versions and machine it was recorded with (a mismatch is named when a comparison fails).
`tests/recipes/test_recipes.py` compares every recipe against it (`compare`).
"""

import argparse
import json
import os
import platform
import re
import subprocess
import sys
from importlib.metadata import version
from typing import Any

from omegaconf import DictConfig, OmegaConf

SHRINK = ["trainer.steps=20", "trainer.log_every=5", "trainer.eval_every=10", "trainer.eval_batches=2",
          "logger=jsonl", "warm_start.overrides=['trainer.steps=20','trainer.eval_batches=1']"]
RTOL = 0.02  # per step: CPU runs are deterministic per jax version; this covers jax 0.10 vs 0.12
MEAN_RTOL = 0.005  # the mean signed residual over steps: a small systematic drift fails
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "qwix")


def expected_dir() -> str:
    from importlib.resources import files

    return str(files("stack.conf.recipe").joinpath("expected"))


def recipe_config(name: str, overrides: list[str] = ()) -> DictConfig:
    """The composed config of `+recipe=name` with `overrides`."""
    from hydra import compose, initialize_config_module

    import stack.schema  # noqa: F401  (registers the schemas)

    with initialize_config_module("stack.conf", version_base=None):
        return compose("config", overrides=[f"+recipe={name}", *overrides])


def header(text: str) -> list[str]:
    """A recipe file's usage header: its comment lines after `# @package _global_`."""
    lines = []
    for line in text.splitlines()[1:]:
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return lines


def header_field(text: str, label: str) -> str:
    """`Runtime: ~30 s.` -> "~30 s" (the header's `label:` up to the first '. ' or ';')."""
    m = re.search(rf"{label}: (.+?)(?:\. |; |\.$|\(|$)", " ".join(header(text)))
    return m.group(1).strip() if m else "-"


def catalogue() -> list[tuple[str, str, str, str, str]]:
    """(name, algorithm, model, hardware, runtime) of every recipe."""
    from stack.schema import recipe_files

    rows = []
    for name, text in sorted(recipe_files().items()):
        cfg = recipe_config(name)
        rows.append((name, cfg.algorithm.name, cfg.model.name, cfg.hardware.name, header_field(text, "Runtime")))
    return rows


def tracked(cfg: DictConfig) -> tuple[str, ...]:
    """The metrics a recipe's regression compares: loss, gradient norm, its objective (+ reward)."""
    from stack.schema import objective_of

    keys = ("train/loss", "train/grad_norm", objective_of(cfg))
    return keys + (("train/reward",) if cfg.data.kind == "prompt" else ())


def snapshot(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as dotted keys, machine-independent (shipped files by name, no run dir)."""
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
    return flat


def machine() -> dict[str, str]:
    """The versions and machine numbers depend on."""
    return {"python": platform.python_version(), **{p: version(p) for p in PACKAGES},
            "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cpus"}


def shrunk_run(name: str, run_dir: str) -> dict[str, Any]:
    """Run the recipe shrunk by SHRINK into `run_dir`: its expectation (as `record` writes it)."""
    from stack.run import run

    cfg = recipe_config(name, [*SHRINK, f"run_dir={run_dir}"])
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
    the rule a resume applies, stack.checkpoint.config_diff)."""
    from stack.checkpoint import config_diff

    changed = [f"  {line}" for line in config_diff(expected["config"], got["config"])]
    return ["the resolved config changed (re-record if intended):", *changed] if changed else []


def version_note(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """A line naming the versions or machine that differ from the recording's (none if equal)."""
    if expected["recorded_with"] == got["recorded_with"]:
        return []
    diff = {k: f"{v} -> {got['recorded_with'].get(k)}" for k, v in expected["recorded_with"].items()
            if got["recorded_with"].get(k) != v}
    return [f"recorded with other versions or another machine ({diff}): numbers may move across "
            "them; re-record with python -m stack.recipes record NAME when the change is expected."]


def _g(x: float | None) -> str:
    return "missing" if x is None else f"{x:.6g}"


def dirty_tree() -> str:
    """`git status --porcelain` of the checkout holding the recipes ('' when clean); no git: a reason."""
    root = os.path.dirname(expected_dir().rstrip("/"))
    try:
        res = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=60)
    except OSError as exc:
        return f"git is not available ({exc})"
    return res.stdout.strip() if res.returncode == 0 else f"{root} is not a git checkout"


def known(names: list[str]) -> None:
    """Exit with one line naming each of `names` that is not a recipe, and the recipes."""
    from stack.schema import recipe_files

    unknown = [n for n in names if n not in recipe_files()]
    if unknown:
        raise SystemExit(f"error: no recipe {', '.join(map(repr, unknown))}; "
                         f"recipes: {', '.join(sorted(recipe_files()))}")


def record(names: list[str]) -> None:
    """Re-record the expectations of `names`; refuses a dirty tree (the numbers must come from a commit)."""
    import tempfile

    known(names)
    dirty = dirty_tree()
    if dirty:
        raise SystemExit(f"error: refusing to record on a dirty tree; commit or stash first:\n{dirty}")
    from stack.recipe_compile import compiled_run, is_real_size

    for name in names:
        with tempfile.TemporaryDirectory() as run_dir:
            exp = compiled_run(name) if is_real_size(recipe_config(name)) else shrunk_run(name, run_dir)
        path = os.path.join(expected_dir(), f"{name}.json")
        with open(path, "w") as f:
            json.dump(exp, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"recorded {path}")


def show(name: str) -> str:
    """A recipe's header, resolved group choices and key settings, and its expected metrics."""
    from stack.schema import GROUPS, recipe_files

    known([name])
    text = recipe_files()[name]
    cfg = recipe_config(name)
    choices = "  ".join(f"{g}={cfg[g].name}" for g in GROUPS)
    t = cfg.trainer
    settings = (f"trainer.steps={t.steps} optimizer.lr={cfg.optimizer.lr} data.batch_size={cfg.data.batch_size} "
                f"data.seq_len={cfg.data.seq_len} seed={cfg.seed}")
    path = os.path.join(expected_dir(), f"{name}.json")
    expected = json.load(open(path)) if os.path.exists(path) else {}
    finals = "  ".join(f"{k}={list(v.values())[-1]:.4g}" for k, v in expected.get("steps", {}).items() if v)
    if "compile" in expected:  # a real-size recipe (stack.recipe_compile)
        c = expected["compile"]
        finals = (f"(mode=compile) {c['per_device_gib']:.2f} GiB per device, {c['flops_per_device']:.4g} FLOPs per "
                  f"device per step, {'fits' if c['fits'] else 'does not fit'}")
    else:
        finals = f"(shrunk: {' '.join(SHRINK[:3])} ...): {finals or '-'}"
    return "\n".join([*header(text), "", f"groups:   {choices}", f"settings: {settings}", f"expected {finals}"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stack.recipes", description=__doc__.splitlines()[0])
    parser.add_argument("args", nargs="*", help="nothing (the list), NAME, or record NAME [NAME ...]")
    args = parser.parse_args(argv).args
    if args[:1] == ["record"]:
        from stack.schema import recipe_files

        record(args[1:] or sorted(recipe_files()))
    elif args:
        print(show(args[0]))
    else:
        rows = [("recipe", "algorithm", "model", "hardware", "runtime"), *catalogue()]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        print("\n".join("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows))


if __name__ == "__main__":
    main(sys.argv[1:])
