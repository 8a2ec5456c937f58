"""Hydra / OmegaConf composition errors as one-paragraph ConfigErrors naming the key, the bad value
and what is allowed (the preflight's, stack.cli.app, and stack.tools.quantize's)."""

import re
from typing import Any

from hydra import compose
from hydra.errors import MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

from stack.errors import ConfigError, bad_choice, null_refused, short, unknown_key, wrong_type


def friendly_error(exc: Exception, overrides: list[str]) -> ConfigError:
    """Turn a Hydra/OmegaConf composition error into a one-paragraph ConfigError."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and exc.options:
        group, _, name = exc.missing_cfg_file.rpartition("/")
        return bad_choice(group, name, exc.options, what="option")
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key:
        full_key = str(cause.full_key)
        valid = getattr(getattr(cause, "object_type", None), "__dataclass_fields__", None)
        if valid is None:  # a plain dict node (e.g. an optimizer.chain entry): its own keys
            others = [o for o in overrides if full_key.replace("[", ".").replace("]", "") not in o]
            try:
                parent = OmegaConf.select(compose(config_name="config", overrides=others),
                                          full_key.rpartition(".")[0], default=None)
            except Exception:  # another override is bad too: report this one without the list
                parent = None
            valid = list(parent.keys()) if isinstance(parent, DictConfig) else []
        return unknown_key(full_key, valid)
    if isinstance(cause, ValidationError) and cause.full_key and "is not Optional" in str(cause):
        return null_refused(str(cause.full_key), _takes(cause.parent_node, cause.key, cause.child_node))
    if isinstance(cause, ValidationError) and cause.full_key:
        key = str(cause.full_key)
        value = next((o.split("=", 1)[1] for o in overrides if o.lstrip("+~").split("=")[0] == key), None)
        m = re.search(r"converted to (\w+)", str(cause))
        expected = m.group(1).lower() if m else str(cause).splitlines()[0]
        return wrong_type(key, value, f"a value of type {expected}")
    added = re.match(r"Could not override '([^']+)'\. No match in the defaults list\.\nTo append .* use (\S+)",
                     str(exc))
    if added:  # e.g. recipe=NAME: a group the defaults list does not hold is added with +
        return ConfigError(f"{short(added[2][1:])}: '{added[1]}' is not a group of the default config, so it cannot be "
                           f"overridden; add it with a plus: {short(added[2])}.")
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return ConfigError(f"Cannot compose the config with overrides {short(overrides, 300)}: {short(first, 300)}")


def _takes(parent: Any, key: Any, node: Any) -> str:
    """What a non-nullable schema key holds, for its error: a section's keys or a value's type."""
    if isinstance(node, DictConfig):
        return f"a section of settings; set its keys instead ({', '.join(map(str, node.keys()))})"
    kind = OmegaConf.get_type(parent, key) if parent is not None else None
    return f"a value of type {kind.__name__}" if isinstance(kind, type) else "a value"
