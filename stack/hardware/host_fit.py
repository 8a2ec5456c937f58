"""Host memory preflight for CPU runs: a model whose training state cannot fit in the memory this
machine (or its cgroup) has available is refused with the sizes, before its weights are drawn.
Without it, `model=llama3_8b` on a 24 GiB machine was killed by the kernel's OOM killer during
init, with no message at all."""

from __future__ import annotations

import os
from typing import Any

import jax

from stack.errors import ConfigError

GiB = 1024**3
NO_LIMIT = 1 << 60  # cgroup v1 reports "no limit" as a huge number


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().split()[0]
    except (OSError, IndexError):
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def available_bytes(root: str = "/") -> int | None:
    """MemAvailable of /proc/meminfo, capped by the cgroup's limit less its usage (v2, then v1);
    None where neither can be read (not Linux)."""
    avail = None
    try:
        with open(os.path.join(root, "proc/meminfo")) as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        pass
    cgroup = os.path.join(root, "sys/fs/cgroup")
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        limit, usage = _read_int(os.path.join(cgroup, limit_file)), _read_int(os.path.join(cgroup, usage_file))
        if limit is not None and limit < NO_LIMIT and usage is not None:
            left = max(limit - usage, 0)
            avail = left if avail is None else min(avail, left)
            break
    return avail


def nbytes(tree: Any) -> int:
    """Bytes of the arrays (or ShapeDtypeStructs) in `tree`."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree) if hasattr(x, "dtype"))


def check_host_memory(model_name: str, params: Any, tx: Any, full_training: bool, avail: int | None) -> None:
    """Refuse when the policy's parameters (+ their gradients and `tx`'s state when every parameter
    trains) exceed `avail` bytes: a lower bound of what the run holds (no activations, reference
    or reward models)."""
    if avail is None:
        return
    parts = {"parameters": nbytes(params)}
    if full_training:
        state = nbytes(jax.eval_shape(tx.init, params))
        parts |= {"their gradients": parts["parameters"], "the optimizer's state": state}
    need = sum(parts.values())
    if need > avail:
        sizes = ", ".join(f"{name} {size / GiB:.1f} GiB" for name, size in parts.items())
        raise ConfigError(
            f"model={model_name} needs at least {need / GiB:.1f} GiB of host memory to train with hardware=cpu "
            f"({sizes}), and this machine has {avail / GiB:.1f} GiB available. Pick a smaller model "
            "(model=llama_tiny, llama_small, llama3_1b), or compile the step for an accelerator from here "
            "(mode=compile with hardware=tpu_v5e, gpu_h100, ...).")
