"""Schema of the `quantization` group: Qwix rules (module-path regex -> LoRA rank, qtypes)."""

from dataclasses import dataclass, field
from typing import List, Optional

PROJECTIONS = ".*(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


@dataclass
class QuantRule:
    # a regex fullmatched against module paths such as layers/0/attn/q_proj, layers/1/mlp/down_proj
    module_path: str = PROJECTIONS
    rank: int = 8  # LoRA rank
    alpha: float = 16.0  # LoRA scale: the adapter adds (alpha / rank) * x A B
    weight_qtype: Optional[str] = None  # None: float base weights (LoRA); nf4 | int8 | int4 (QLoRA)
    tile_size: Optional[int] = None  # sub-channel quantization tile; must divide the contraction dim


@dataclass
class QuantizationConfig:
    name: str = "none"
    method: str = "none"  # none | lora (the base weights frozen, quantized when weight_qtype is set)
    rules: List[QuantRule] = field(default_factory=list)
