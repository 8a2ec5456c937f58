"""Per-user caches that make a rerun start faster: XLA's persistent compilation cache (a rerun
of the same program loads the compiled executable) and the measured CPU peak (per machine).

Root: `$STACK_CACHE_DIR`, else `$XDG_CACHE_HOME/stack`, else `~/.cache/stack`."""

import os
import socket

import jax

COMPILE_MIN_SECONDS = 0.0  # cache every program: on CPU most compile in under jax's 1 s default


def cache_root() -> str:
    """The directory of stack's per-user caches."""
    if os.environ.get("STACK_CACHE_DIR"):
        return os.environ["STACK_CACHE_DIR"]
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "stack")


def machine_file(name: str) -> str:
    """`<cache root>/<name>-<hostname>.json`: a value measured once per machine."""
    return os.path.join(cache_root(), f"{name}-{socket.gethostname()}.json")


def compilation_cache_dir() -> str:
    """The persistent compilation cache a run uses by default: JAX_COMPILATION_CACHE_DIR, else
    `<cache root>/jax`."""
    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(cache_root(), "jax")


def disable_compilation_cache() -> None:
    """No persistent cache in this process, JAX_COMPILATION_CACHE_DIR's included: for mode=compile to a
    TPU topology or GPUs, whose executables jax can write but not load back without the device (a
    warning per program)."""
    jax.config.update("jax_enable_compilation_cache", False)


def enable_compilation_cache(setting: str | None) -> str | None:
    """Point jax's persistent compilation cache at `setting` (`auto`: `<cache root>/jax`; `off`
    or null: none) unless the user configured one (JAX_COMPILATION_CACHE_DIR wins); the dir used."""
    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    if setting in (None, "off"):
        return None
    path = compilation_cache_dir() if setting == "auto" else os.path.expanduser(setting)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", COMPILE_MIN_SECONDS)
    return path
