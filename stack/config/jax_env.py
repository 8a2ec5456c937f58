"""The environment jax must see before it is imported (it reads `JAX_PLATFORMS` and its other
flags from the environment once, at import): set from the run's config."""

import os
from typing import Any


def set_jax_env(cfg: Any) -> None:
    """CPU runs: no TPU/GPU plugin to initialise (libtpu, installed for mode=compile, probes for
    TPUs at every jax start otherwise: ~0.25 s and a page of errors on a machine without one).
    A GPU mode=compile: compile-only GPUs on the CPU backend (stack.hardware.gpu_target), whose
    executables the compilation cache cannot load back."""
    if cfg.mode == "compile" and cfg.hardware.platform == "gpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
        os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    if cfg.hardware.platform == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
