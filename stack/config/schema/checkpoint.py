"""Schema of the `checkpoint` group: Orbax tiers, cadence and retention."""

from dataclasses import dataclass
from typing import Optional


@dataclass
class TierConfig:
    """A second checkpoint tier (e.g. the durable one of `multi_tier`)."""

    path: Optional[str] = None  # any Orbax/TensorStore-supported path or URI
    every: int = 0  # steps between saves; 0: off
    keep: int = 1


@dataclass
class CheckpointConfig:
    name: str = "none"
    path: Optional[str] = None  # the primary tier; None: <run_dir>/checkpoints
    every: int = 0  # steps between saves of the primary tier; 0: never
    keep: int = 2
    persistent: Optional[TierConfig] = None  # a second, less frequent durable tier
    async_save: bool = True
    # hand each save to a thread, on a device copy of the state, so the device-to-host transfer
    # overlaps the next steps; null: only when that copy fits in free device memory (stack.engine.trainer.save_overlap)
    overlap: Optional[bool] = None
    resume: str = "auto"  # auto | never | PATH (another run's dir or its checkpoints dir, with a complete step)
