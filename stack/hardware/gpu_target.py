"""Compile-only NVIDIA GPU devices for `mode=compile`, on a machine without the GPU.

XLA:GPU compiles for a device described by a `GpuTargetConfig` (text proto) instead of a
present GPU, through the CUDA PJRT plugin (`pip install -e ".[gpu-aot]"`: jax's cuda12
extra, whose ptxas compiles the kernels). The plugin must be registered without starting
CUDA: `stack.cli.app` sets JAX_PLATFORMS=cpu and JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 for a GPU
`mode=compile` before jax is imported. XLA:GPU gives no cost analysis this way (the FLOPs
come from the model formula); its memory analysis is the compiled program's.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import jax

from stack.errors import ConfigError

GPUS_PER_HOST = 8  # an HGX/DGX node
# Device facts of the targets (hardware.device_kind), as XLA's GpuTargetConfig reads them;
# H100 SXM5 80GB: 132 SMs, compute capability 9.0, 50 MiB L2, 3.35 TB/s, CUDA 12.8, cuDNN 9.7.
TARGETS = {
    "NVIDIA H100 80GB HBM3": """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000 l2_cache_size: 52428800 clock_rate_ghz: 1.98
  device_memory_size: 84929347584 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 } registers_per_core_limit: 65536 registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 7 }
runtime_version { major: 12 minor: 8 }
device_description_str: "NVIDIA H100 80GB HBM3"
""",
}


def gpu_topology(chips: int) -> str:
    """XLA's GPU topology string, slices x hosts x devices per host, for `chips` GPUs."""
    per_host = min(chips, GPUS_PER_HOST)
    if chips % per_host:
        raise ConfigError(f"'hardware.chips'={chips} GPUs do not fill hosts of {GPUS_PER_HOST}; use a multiple.")
    return f"1x{chips // per_host}x{per_host}"


def plugin_installed() -> bool:
    """Whether jax's CUDA 12 PJRT plugin is importable (the gpu-aot extra)."""
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:  # no jax_plugins namespace at all
        return False


def gpu_devices(hw: Any) -> list[jax.Device]:
    """`hw.chips` compile-only devices of `hw.device_kind` (no GPU needed)."""
    if hw.device_kind not in TARGETS:
        raise ConfigError(f"mode=compile has no GPU target description for hardware.device_kind="
                          f"{hw.device_kind!r} (hardware={hw.name}); described: {sorted(TARGETS)}.")
    topology = gpu_topology(hw.chips)
    if not plugin_installed():
        raise ConfigError(
            f"mode=compile for hardware={hw.name} needs the CUDA compiler plugin, which is not installed. "
            f'Install the extra in its own venv: pip install -e ".[gpu-aot]" (jax[cuda12], ~5 GB).')
    from jax.experimental import topologies  # the compile-only CUDA backend: after the plugin check

    topo = topologies.get_topology_desc(platform="cuda", target_config=TARGETS[hw.device_kind], topology=topology)
    return list(topo.devices)
