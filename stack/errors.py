"""User-facing errors: one paragraph that names the key, the bad value and what is allowed."""

import difflib
import os
import re
import sys
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class ConfigError(Exception):
    """A config that cannot run. Its message is shown as is, without a traceback."""


class RunDirRefused(ConfigError):
    """The run dir belongs to another run (in use, completed, or checkpoints this config cannot
    resume): the job leaves it as it is, its status.json included."""


class RunDirInUse(RunDirRefused):
    """The run dir is held by a live run (its lock): it may be free later."""


class RunFailed(Exception):
    """A run that stopped for a reason the user must act on (e.g. a NaN loss): one paragraph, exit 1."""


class DataError(ConfigError):
    """A data file or record that cannot be used; the message starts with `file:line: `."""


class ModuleMoved(ModuleNotFoundError):
    """An import of a module path of stack 0.1, which moved when stack/ became layered packages
    (stack 0.2): the message names the new path (raised by the finder stack/__init__.py installs)."""


# stack 0.1's module paths -> stack 0.2's (a submodule of a moved package moved with it)
MOVED = {
    "stack.app": "stack.cli.app",
    "stack.build": "stack.run.build",
    "stack.cache": "stack.hardware.compile_cache",
    "stack.checkpoint": "stack.checkpoint.manager",
    "stack.checkpoint_errors": "stack.checkpoint.errors",
    "stack.collector": "stack.hardware.gc_freeze",
    "stack.compile": "stack.engine.aot",
    "stack.compose_errors": "stack.config.compose_errors",
    "stack.cpu_compiler": "stack.hardware.cpu_compiler",
    "stack.cpu_dispatch": "stack.hardware.cpu_dispatch",
    "stack.generate": "stack.tools.generate",
    "stack.gpu_target": "stack.hardware.gpu_target",
    "stack.hardware": "stack.hardware.platform",
    "stack.hf": "stack.tools.hf",
    "stack.host_fit": "stack.hardware.host_fit",
    "stack.host_memory": "stack.hardware.host_memory",
    "stack.hydra_plugin": "stack.launch.hydra_plugin",
    "stack.hydra_run": "stack.launch.hydra_job",
    "stack.jobstatus": "stack.checkpoint.job_status",
    "stack.launch_cloud": "stack.launch.cloud",
    "stack.launch_slurm": "stack.launch.slurm",
    "stack.launcher": "stack.launch.local",
    "stack.models.hf_config": "stack.config.hf_config",
    "stack.parallel": "stack.hardware.mesh",
    "stack.policy": "stack.checkpoint.policy",
    "stack.precompile": "stack.engine.precompile",
    "stack.precompute": "stack.engine.precompute",
    "stack.quant.config": "stack.config.quantization",
    "stack.quantize": "stack.tools.quantize",
    "stack.recipe_compile": "stack.tools.recipe_compile",
    "stack.recipes": "stack.tools.recipes",
    "stack.report": "stack.launch.report",
    "stack.run": "stack.run.modes",
    "stack.rundir": "stack.checkpoint.rundir",
    "stack.saved_params": "stack.checkpoint.saved_params",
    "stack.schema": "stack.config.schema",
    "stack.step": "stack.engine.step",
    "stack.summary": "stack.engine.summary",
    "stack.sweeper": "stack.launch.sweeper",
    "stack.targets": "stack.config.targets",
    "stack.trainer": "stack.engine.trainer",
    "stack.validate": "stack.config.validate",
    "stack.warm_start": "stack.run.warm_start",
    "stack.worker_cores": "stack.launch.worker_cores",
}


def moved_to(name: str) -> str | None:
    """Where module `name` of stack 0.1 lives now (None: it did not move)."""
    def inside(old: str) -> bool:  # a submodule of a moved package (not of a name that is now a package)
        return name.startswith(old + ".") and not MOVED[old].startswith(old + ".")

    old = next((o for o in sorted(MOVED, key=len, reverse=True) if name == o or inside(o)), None)
    return None if old is None else MOVED[old] + name[len(old):]


def short(value: object, limit: int = 80) -> str:
    """`value` as text, its middle cut out when longer than `limit` (errors echo user input)."""
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit // 2]}...({len(text)} characters)...{text[-limit // 4:]}"


def paragraph(exc: BaseException) -> str:
    """`error: ` and the message of a user-facing error, each word of more than 200 characters (an
    echoed value: a 100 kB override, a path) cut in the middle as `short` cuts it."""
    return "error: " + re.sub(r"\S{201,}", lambda m: short(m.group(), 160), str(exc))


@contextmanager
def exit_on(*kinds: type[Exception]) -> Iterator[None]:
    """An error of `kinds` (default: ConfigError) raised within ends the process: its paragraph on
    stderr, exit 2 (1 for a RunFailed: a failure during the work); with HYDRA_FULL_ERROR=1 it
    propagates, traceback and all."""
    try:
        yield
    except kinds or (ConfigError,) as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(paragraph(exc), file=sys.stderr)
        sys.exit(1 if isinstance(exc, RunFailed) else 2)


def one_line_warnings() -> None:
    """Warnings that stack itself issues print as `warning: MESSAGE` (one line; before, Python's
    format added the file:line and the source line that warned); others keep Python's format."""
    default = warnings.formatwarning

    def formatted(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  line: str | None = None) -> str:
        if "/stack/" in filename.replace("\\", "/"):
            return f"warning: {message}\n"
        return default(message, category, filename, lineno, line)

    warnings.formatwarning = formatted


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
