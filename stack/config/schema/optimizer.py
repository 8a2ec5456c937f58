"""Schema of the `optimizer` group: an Optax chain written as a list of transforms."""

from dataclasses import dataclass, field
from typing import Any, Dict, List


@dataclass
class OptimizerConfig:
    name: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    clip_norm: float = 1.0
    warmup_steps: int = 0
    # The learning-rate schedule: a node with `_target_` (an optax schedule) or null (constant lr).
    schedule: Any = None
    # The chain: a list of nodes with `_target_` (optax transforms), applied in order.
    chain: List[Any] = field(default_factory=list)
    # Free-form knobs a chain may interpolate (`${optimizer.extra.x}`).
    extra: Dict[str, Any] = field(default_factory=dict)
