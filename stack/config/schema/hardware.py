"""Schema of the `hardware` group: the target platform and its published peaks."""

from dataclasses import dataclass
from typing import Optional


@dataclass
class HardwareConfig:
    name: str = "cpu"
    platform: str = "cpu"  # cpu | gpu | tpu
    device_kind: Optional[str] = None
    topology: Optional[str] = None
    chips: int = 1
    peak_flops_per_chip: Optional[float] = None  # bf16 FLOP/s; None: measured (cpu)
    hbm_bytes_per_chip: Optional[int] = None
    dtype: str = "float32"
    param_dtype: str = "float32"
    default_mesh: str = "single"
    async_dispatch: Optional[bool] = None  # cpu: null = by the step's temporaries (stack.hardware.cpu_dispatch)
