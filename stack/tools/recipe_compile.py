"""Expectations of the real-size recipes (a TPU or GPU target): what `mode=compile` reports.

A real-size recipe cannot run on the machine that tests it, so its expectation is the compiled
train step for its target (stack.engine.aot, through the same `python -m stack +recipe=NAME
mode=compile` a user runs; TPU targets need the tpu extra): the per-device memory total and
XLA's FLOPs per device per step, each with a relative tolerance, whether it fits, plus the
resolved-config snapshot and the versions it was recorded with (stack.tools.expectations).
"""

import re
import subprocess
import sys
from importlib.metadata import version
from typing import Any

from omegaconf import DictConfig

from stack.tools.expectations import config_changes, machine, recipe_config, snapshot, version_note

TOLERANCE = {"per_device_gib": 0.02, "flops_per_device": 0.02}
COMPILERS = {"tpu": "libtpu", "gpu": "jax-cuda12-plugin"}  # the package that compiles for the target
TOTAL = re.compile(r"per device total: ([\d.]+) GiB")
FLOPS = re.compile(r"FLOPs per device per step: ([\d.e+-]+) \(XLA\)")


def is_real_size(cfg: DictConfig) -> bool:
    """A recipe for an accelerator: its regression is `mode=compile`, not a shrunk CPU run."""
    return cfg.hardware.platform != "cpu"


def parse_report(stdout: str) -> dict[str, Any]:
    """The numbers of a `mode=compile` report: per-device GiB, FLOPs per device per step, fits."""
    total, flops = TOTAL.search(stdout), FLOPS.search(stdout)
    if total is None or flops is None:
        tail = "\n".join(stdout.strip().splitlines()[-5:])
        raise RuntimeError(f"mode=compile printed no per-device total / FLOPs line; its last lines:\n{tail}")
    return {"per_device_gib": float(total.group(1)), "flops_per_device": float(flops.group(1)),
            "fits": "\nfits: " in f"\n{stdout}"}


def compiled_run(name: str) -> dict[str, Any]:
    """`python -m stack +recipe=NAME mode=compile` in a child process: its expectation."""
    res = subprocess.run([sys.executable, "-m", "stack", f"+recipe={name}", "mode=compile"],
                         capture_output=True, text=True, check=False)
    if res.returncode not in (0, 1):  # 1: compiled, does not fit (recorded as such)
        raise RuntimeError(f"+recipe={name} mode=compile failed (exit {res.returncode}):\n{res.stderr[-2000:]}")
    cfg = recipe_config(name)
    compiler = COMPILERS[cfg.hardware.platform]
    return {"recorded_with": {**machine(), compiler: version(compiler)}, "overrides": ["mode=compile"],
            "compile": parse_report(res.stdout), "tolerance": TOLERANCE, "config": snapshot(cfg)}


def compare_compile(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Readable differences of a compiled recipe from its expectation; [] when it holds."""
    rows = []
    for key, tol in expected["tolerance"].items():
        want, have = expected["compile"][key], got["compile"][key]
        if abs(have - want) > tol * abs(want):
            rows.append(f"  {key:<18} {want:>12.6g} {have:>12.6g}  {tol:g}")
    out = [f"  {'number':<18} {'expected':>12} {'got':>12}  rtol", *rows] if rows else []
    if expected["compile"]["fits"] != got["compile"]["fits"]:
        out.append(f"fits: expected {expected['compile']['fits']}, got {got['compile']['fits']}")
    out += config_changes(expected, got)
    return out + version_note(expected, got) if out else out
