"""A logged row as a few short lines grouped by prefix (`eval/rewards: chosen 0.1 margins 0.2`),
for the console: a DPO/GRPO/PPO row is 20-30 metrics, unreadable as one line."""

import math

WIDTH = 100  # a group's line wraps past this many characters


def number(v: float) -> str:
    """4 decimals in the usual range of losses and rewards, else 4 significant digits in e-notation."""
    if not math.isfinite(v):
        return str(v)
    return f"{v:.4f}" if v == 0 or 1e-3 <= abs(v) < 1e6 else f"{v:.3e}"


def groups(metrics: dict[str, float]) -> dict[str, list[str]]:
    """`prefix -> ["name value", ...]`, the prefix being a key up to its last "/": the shortest
    prefixes first, `loss` first in its group, else by name."""
    def order(key: str) -> tuple:
        prefix, _, name = key.rpartition("/")
        return prefix.count("/"), prefix, name != "loss", name

    out: dict[str, list[str]] = {}
    for key in sorted(metrics, key=order):
        prefix, _, name = key.rpartition("/")
        out.setdefault(prefix, []).append(f"{name} {number(metrics[key])}")
    return out


def wrapped(lead: str, items: list[str]) -> list[str]:
    """`lead item item ...`, continued on lines indented by 4 past WIDTH characters."""
    lines, line, empty = [], lead, True
    for item in items:
        if not empty and len(line) + 1 + len(item) > WIDTH:
            lines.append(line)
            line = " " * 3
        line, empty = f"{line} {item}", False
    return [*lines, line]


def row_lines(head: str, metrics: dict[str, float], inline: bool = True) -> list[str]:
    """`head` + the first group on one line (`inline`; else `head` alone), each further group on a
    line of its own, indented."""
    lines = [] if inline else [head]
    for i, (prefix, items) in enumerate(groups(metrics).items()):
        lead = f"{head}  {prefix}:" if i == 0 and inline else f"  {prefix}:"
        lines += wrapped(lead, items)
    return lines
