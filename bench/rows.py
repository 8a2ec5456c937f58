"""The result rows of the benches: each bench prints its human lines and, per headline ratio, one
machine-readable row (`emit`) that `python -m bench` collects into its table."""

import json
import operator

PREFIX = "bench-row "
OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}


def emit(name: str, ratio: float, goal: str) -> None:
    """Print the row `name`: the measured `ratio` and its `goal` ("<= 0.05", ">= 5", ...)."""
    op, _ = goal.split()
    assert op in OPS, goal
    print(PREFIX + json.dumps({"name": name, "ratio": ratio, "goal": goal}), flush=True)


def holds(ratio: float, goal: str) -> bool:
    op, value = goal.split()
    return OPS[op](ratio, float(value))


def parse(stdout: str) -> list[dict]:
    """The rows a bench printed."""
    return [json.loads(line[len(PREFIX):]) for line in stdout.splitlines() if line.startswith(PREFIX)]
