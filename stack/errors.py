"""User-facing errors: one paragraph that names the key, the bad value and what is allowed."""

import difflib
from collections.abc import Iterable


class ConfigError(Exception):
    """A config that cannot run. Its message is shown as is, without a traceback."""


class RunDirRefused(ConfigError):
    """The run dir belongs to another run (in use, completed, or checkpoints this config cannot
    resume): the job leaves it as it is, its status.json included."""


class RunFailed(Exception):
    """A run that stopped for a reason the user must act on (e.g. a NaN loss): one paragraph, exit 1."""


class DataError(ConfigError):
    """A data file or record that cannot be used; the message starts with `file:line: `."""


def short(value: object, limit: int = 80) -> str:
    """`value` as text, its middle cut out when longer than `limit` (errors echo user input)."""
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit // 2]}...({len(text)} characters)...{text[-limit // 4:]}"


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """' Did you mean X?' (or 'X or Y') for the closest options, '' when nothing is close."""
    if len(word) > 100:  # nothing is close to a very long word; difflib would be slow
        return ""
    close = difflib.get_close_matches(word, list(options), n=2, cutoff=0.7)
    return f" Did you mean {' or '.join(close)}?" if close else ""


def unknown_key(full_key: str, valid: Iterable[str]) -> ConfigError:
    """Error for a key that the schema of its parent does not have."""
    parent, _, key = full_key.rpartition(".")
    valid = sorted(valid)
    where = f"'{parent}'" if parent else "the top level"
    return ConfigError(
        f"Unknown config key '{short(full_key)}': {where} has no key '{short(key)}'."
        f"{did_you_mean(key, valid)} Valid keys: {', '.join(valid)}."
    )


def wrong_type(full_key: str, value: object, expected: str) -> ConfigError:
    """Error for a value that does not convert to the schema's type."""
    return ConfigError(
        f"Wrong type for '{full_key}': got {short(repr(value))}, expected {expected}."
    )


def null_refused(full_key: str, takes: str) -> ConfigError:
    """Error for `key=null` where the schema has no null (e.g. `warm_start=null`, `trainer.steps=null`)."""
    return ConfigError(f"'{full_key}' cannot be null: it takes {takes}.")


def bad_choice(full_key: str, value: object, allowed: Iterable[str], what: str = "value") -> ConfigError:
    """Error for a value outside a closed set (a group option, an enum-like string)."""
    allowed = sorted(allowed)
    return ConfigError(
        f"Unknown {what} {short(repr(value))} for '{full_key}'.{did_you_mean(str(value), allowed)} "
        f"Available: {', '.join(allowed) or '(none)'}."
    )
