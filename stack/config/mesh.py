"""The `mesh` group's sizes and rules, checked before anything runs: every rule names mesh axes,
`mesh.context` splits the sequence (context parallelism) through the `length` rule, and `mesh.expert`
the routed experts (expert parallelism) through the `expert` rule."""

from typing import Any

from stack.config.schema.mesh import MESH_AXES
from stack.errors import ConfigError, short


def _named(target: Any) -> list[str]:
    """The mesh axes a rule's target names (null, a name, or a list of names)."""
    return [target] if isinstance(target, str) else list(target or [])


def check_rules(mesh: Any, experts: Any = None) -> None:
    """Each `mesh.rules` entry maps a logical axis to null, a mesh axis or a list of them; the model's
    `experts` split as `mesh.expert` says (check_experts)."""
    for name, target in mesh.rules.items():
        bad = [a for a in _named(target) if a not in MESH_AXES]
        if bad:
            raise ConfigError(f"'mesh.rules.{name}' names {short(bad[0])!r}, which is not a mesh axis: use null, "
                              f"one of {', '.join(MESH_AXES)}, or a list of them.")
    check_experts(mesh, experts)


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


def check_experts(mesh: Any, experts: Any) -> None:
    """`mesh.expert` (null: 1) splits the model's `experts` (model.num_experts) through the `expert` rule."""
    size = 1 if mesh.get("expert") is None else mesh.expert
    axis = mesh.rules.get("expert")
    if size == 1:
        return
    if not isinstance(size, int) or size < 1 or axis != "expert":
        raise ConfigError(f"'mesh.expert'={size!r} splits the routed experts over that many devices through the rule "
                          f"mesh.rules.expert (now {axis!r}), which must be the `expert` axis: use mesh=expert "
                          f"mesh.expert={size} (a positive integer).")
    if not experts or experts % size:
        raise ConfigError(f"'mesh.expert'={size} splits the routed experts, and model.num_experts={experts}: it "
                          "must be a multiple of mesh.expert (each device holds an equal share). A dense model has "
                          "no experts to split: set mesh.expert=1 or pick another mesh.")
