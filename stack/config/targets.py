"""What a config may make the program import and call: `_target_`s and reward functions
named by import path.

A path is judged before anything is built, in two steps:
1. its text must lie in a trusted package (`TRUSTED`) or one the user listed on purpose in
   `allow_targets`; anything else is refused without being imported (no side effect);
2. the object it names is resolved (the longest importable module inside that package,
   then attributes) and must be a class or a function *defined* in an allowed package
   (its `__module__`), so a stdlib object reached through an allowed module
   (`stack.checkpoint.manager.shutil.copyfile`, `stack.cli.app.os.system`) is refused as well.
Targets are read from the resolved config, so an interpolation (`${oc.env:...}`,
`${oc.create:...}`) cannot hide one.
"""

import importlib
import inspect
from typing import Any

from omegaconf import DictConfig, OmegaConf

from stack.config.schema.reward import RewardConfig
from stack.errors import ConfigError, ModuleMoved, bad_choice, short

TRUSTED = ("stack", "optax", "flax", "jax", "qwix", "grain", "orbax")


def packages(allow_targets: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The trusted packages plus the user's `allow_targets` (prefixes, with or without a dot)."""
    return TRUSTED + tuple(p.rstrip(".") for p in allow_targets)


def _inside(name: str, allowed: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in allowed)


def _module_of(parts: list[str], allowed: tuple[str, ...]) -> tuple[Any, int]:
    """The longest importable module `parts[:i]` inside `allowed`, and i."""
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        if not _inside(name, allowed):
            break
        try:
            return importlib.import_module(name), i
        except ModuleMoved as exc:  # a path of stack 0.1: the message names the new one
            raise LookupError(str(exc)) from None
        except ModuleNotFoundError as exc:
            if not (exc.name and f"{name}.".startswith(f"{exc.name}.")):  # a dependency of it is missing
                raise
    raise LookupError(f"no module of {'.'.join(parts)} can be imported (is its package installed?)")


def resolve(path: str, allowed: tuple[str, ...]) -> Any:
    """The class or function `path` names; LookupError with the reason when it may not be used."""
    if not _inside(path, allowed):
        raise LookupError(f"it is outside the allowed packages ({', '.join(allowed)}) and is not imported")
    parts = path.split(".")
    obj, i = _module_of(parts, allowed)
    for attr in parts[i:]:
        if attr.startswith("__") or not hasattr(obj, attr):
            raise LookupError(f"{'.'.join(parts[:i])} has no attribute {attr!r}")
        obj, i = getattr(obj, attr), i + 1
    home = getattr(obj, "__module__", None)
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        raise LookupError(f"it names a {type(obj).__name__}, not a class or function")
    if not isinstance(home, str) or not _inside(home, allowed):
        raise LookupError(f"it is {home}.{getattr(obj, '__qualname__', '?')}, defined outside the allowed packages")
    return obj


def targets(node: Any, path: str = "") -> list[tuple[str, Any]]:
    """All (config path, `_target_` value) pairs in a resolved container."""
    found = []
    if isinstance(node, dict):
        for key, child in node.items():
            if key == "_target_":
                found.append((path.rstrip(".") or "<root>", child))
            else:
                found.extend(targets(child, f"{path}{key}."))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            found.extend(targets(child, f"{path}{i}."))
    return found


def check_targets(cfg: DictConfig, allow_targets: tuple[str, ...] = (), objects: bool = True) -> None:
    """Raise ConfigError naming the key when a `_target_` of `cfg` may not be built. `objects`
    False: step 1 only (no import; the pre-run check, which must not import jax)."""
    allowed = packages(allow_targets)
    for key, target in targets(OmegaConf.to_container(cfg, resolve=True)):
        try:
            if objects:
                resolve(str(target), allowed)
            elif not _inside(str(target), allowed):
                raise LookupError(f"it is outside the allowed packages ({', '.join(allowed)}) and is not imported")
        except LookupError as why:
            raise ConfigError(
                f"'{key}._target_'={short(repr(target))} cannot be built: {why}. Only classes and functions "
                f"of {', '.join(TRUSTED)} are built, and of the packages listed in 'allow_targets' "
                "when you add one on purpose (e.g. allow_targets=[mypkg]).") from None


def check_reward_function(name: str, allowed: tuple[str, ...]) -> None:
    """A built-in rule, or an import path under a package the user listed in `allow_targets`."""
    if name in RewardConfig.rules:
        return
    if "." not in name:
        raise bad_choice("reward.functions", name, sorted(RewardConfig.rules), what="reward function")
    if not name.startswith(tuple(p if p.endswith(".") else p + "." for p in allowed)):
        raise ConfigError(f"'reward.functions' entry {name!r} is not a built-in rule "
                          f"({', '.join(sorted(RewardConfig.rules))}) "
                          f"and its module is not allowed; to run it on purpose add "
                          f"'allow_targets=[{name.rsplit('.', 1)[0]}]'.")
