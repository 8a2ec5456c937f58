"""`python -m stack.tools.recipes`: the recipe catalogue and its expectations.

    python -m stack.tools.recipes                      # name, algorithm, model, hardware, runtime: a line each
    python -m stack.tools.recipes llama_grpo           # its header, resolved choices, expected metrics
    python -m stack.tools.recipes record llama_dpo     # re-record recipes/expected/llama_dpo.json (clean tree only)

Expectations are written and compared by stack.tools.expectations (CPU recipes, shrunk runs) and
stack.tools.recipe_compile (real-size recipes, `mode=compile`).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

from omegaconf import DictConfig

from stack.config.schema import GROUPS, recipe_files
from stack.config.schema.logger import SINKS
from stack.errors import ConfigError, exit_on, short
from stack.tools.expectations import SHRINK, expected_dir, recipe_config, shrunk_run
from stack.tools.recipe_compile import compiled_run, is_real_size


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


def composed(name: str) -> DictConfig:
    """`+recipe=name` composed; ConfigError naming the recipe's file if it does not compose."""
    try:
        return recipe_config(name)
    except Exception as exc:  # Hydra's and OmegaConf's errors: a recipe file that is not one
        why = short(" ".join(str(exc).split()) or type(exc).__name__, 240)
        raise ConfigError(f"The recipe {name!r} (recipes/{name}.yaml) cannot be composed ({why}); fix the file, "
                          f"or see the full error with HYDRA_FULL_ERROR=1 python -m stack +recipe={name} "
                          "--cfg job.") from None


def catalogue() -> tuple[list[tuple[str, str, str, str, str]], list[ConfigError]]:
    """(name, algorithm, model, hardware, runtime) of every recipe that composes; the errors of those that do not."""
    rows, errors = [], []
    for name, text in sorted(recipe_files().items()):
        try:
            cfg = composed(name)
        except ConfigError as exc:
            errors.append(exc)
            continue
        rows.append((name, cfg.algorithm.name, cfg.model.name, cfg.hardware.name, header_field(text, "Runtime")))
    return rows, errors


def dirty_tree() -> str:
    """`git status --porcelain` of the checkout holding the recipes ('' when clean); no git: a reason."""
    root = os.path.dirname(expected_dir().rstrip("/"))
    try:
        res = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=60)
    except OSError as exc:
        return f"git is not available ({exc})"
    return res.stdout.strip() if res.returncode == 0 else f"{root} is not a git checkout"


def known(names: list[str]) -> None:
    """ConfigError naming each of `names` that is not a recipe, and the recipes."""
    unknown = [n for n in names if n not in recipe_files()]
    if unknown:
        raise ConfigError(f"no recipe {', '.join(map(repr, unknown))}; recipes: {', '.join(sorted(recipe_files()))}.")


def record(names: list[str]) -> None:
    """Re-record the expectations of `names`; refuses a dirty tree (the numbers must come from a commit)."""
    known(names)
    dirty = dirty_tree()
    if dirty:
        changed = [line[3:] for line in dirty.splitlines()]
        raise ConfigError(f"refusing to record on a dirty tree (the numbers must come from a commit): commit or stash "
                          f"first; changed: {short(', '.join(changed), 400)}.")
    for name in names:
        with tempfile.TemporaryDirectory() as run_dir:
            exp = compiled_run(name) if is_real_size(composed(name)) else shrunk_run(name, run_dir)
        path = os.path.join(expected_dir(), f"{name}.json")
        with open(path, "w") as f:
            json.dump(exp, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"recorded {path}")


def read_expected(name: str) -> dict[str, Any]:
    """recipes/expected/NAME.json ({} when the recipe has none); ConfigError naming it if it is not JSON."""
    path = os.path.join(expected_dir(), f"{name}.json")
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            expected = json.load(f)
        if not isinstance(expected, dict):
            raise ValueError(f"a {type(expected).__name__}, not an object")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path!r} cannot be read as a recipe's expectations ({type(exc).__name__}: "
                          f"{short(exc, 160)}); restore it from git (git checkout -- {path}) or record it again "
                          f"(python -m stack.tools.recipes record {name}).") from None
    return expected


def show(name: str) -> str:
    """A recipe's header, resolved group choices and key settings, and its expected metrics."""
    known([name])
    text = recipe_files()[name]
    cfg = composed(name)
    sinks = ",".join(s for s in SINKS if cfg.logger[s])  # logger is a list of sinks, the rest one option each
    choices = "  ".join(f"{g}={cfg[g].name}" if g != "logger" else f"logger=[{sinks}]" for g in GROUPS)
    t = cfg.trainer
    settings = (f"trainer.steps={t.steps} optimizer.lr={cfg.optimizer.lr} data.batch_size={cfg.data.batch_size} "
                f"data.seq_len={cfg.data.seq_len} seed={cfg.seed}")
    expected = read_expected(name)
    finals = "  ".join(f"{k}={list(v.values())[-1]:.4g}" for k, v in expected.get("steps", {}).items() if v)
    if "compile" in expected:  # a real-size recipe (stack.tools.recipe_compile)
        c = expected["compile"]
        finals = (f"(mode=compile) {c['per_device_gib']:.2f} GiB per device, {c['flops_per_device']:.4g} FLOPs per "
                  f"device per step, {'fits' if c['fits'] else 'does not fit'}")
    else:
        finals = f"(shrunk: {' '.join(SHRINK[:3])} ...): {finals or '-'}"
    return "\n".join([*header(text), "", f"groups:   {choices}", f"settings: {settings}", f"expected {finals}"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stack.tools.recipes", description=__doc__.splitlines()[0])
    parser.add_argument("args", nargs="*", help="nothing (the list), NAME, or record NAME [NAME ...]")
    args = parser.parse_args(argv).args
    with exit_on(ConfigError):
        if args[:1] == ["record"]:
            record(args[1:] or sorted(recipe_files()))
        elif args:
            print(show(args[0]))
        else:
            print_catalogue()


def print_catalogue() -> None:
    """The catalogue, a line per recipe; then a recipe that does not compose is a ConfigError."""
    found, errors = catalogue()
    rows = [("recipe", "algorithm", "model", "hardware", "runtime"), *found]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print("\n".join("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows))
    if errors:
        raise ConfigError(" ".join(str(e) for e in errors))


if __name__ == "__main__":
    main(sys.argv[1:])
