"""The `mesh` group's sizes and rules, checked before anything runs: every rule names mesh axes, and
`mesh.context` splits the sequence (context parallelism) through the `length` rule."""

from typing import Any

from stack.config.schema.mesh import MESH_AXES
from stack.errors import ConfigError, short


def _named(target: Any) -> list[str]:
    """The mesh axes a rule's target names (null, a name, or a list of names)."""
    return [target] if isinstance(target, str) else list(target or [])


def check_rules(mesh: Any) -> None:
    """Each `mesh.rules` entry maps a logical axis to null, a mesh axis or a list of them."""
    for name, target in mesh.rules.items():
        bad = [a for a in _named(target) if a not in MESH_AXES]
        if bad:
            raise ConfigError(f"'mesh.rules.{name}' names {short(bad[0])!r}, which is not a mesh axis: use null, "
                              f"one of {', '.join(MESH_AXES)}, or a list of them.")


def check_context(mesh: Any, seq_len: int) -> int:
    """`mesh.context` (null: 1) splits `data.seq_len` through the `length` rule; the size, checked."""
    context = 1 if mesh.get("context") is None else mesh.context
    if context == 1:
        return 1
    axes = mesh.rules.get("length")
    if not isinstance(context, int) or context < 1 or "context" not in _named(axes):
        raise ConfigError(f"'mesh.context'={context!r} splits each sequence over that many devices through the rule "
                          f"mesh.rules.length (now {axes!r}), which must name the `context` axis: use "
                          f"mesh=context mesh.context={context} (a positive integer).")
    if seq_len % context:
        raise ConfigError(f"'mesh.context'={context} does not divide data.seq_len={seq_len}: each of the "
                          f"{context} devices holds an equal part of every sequence.")
    return context
