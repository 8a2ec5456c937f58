"""Schema of the `quantization` group: a method and a list of Qwix rules (module-path regex ->
weight/activation qtypes, tile size, calibration; LoRA rank and alpha)."""

from dataclasses import dataclass, field
from typing import List, Optional

PROJECTIONS = ".*(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


@dataclass
class QuantRule:
    # a regex fullmatched against module paths such as layers/0/attn/q_proj, layers/1/mlp/down_proj, lm_head
    module_path: str = PROJECTIONS
    weight_qtype: Optional[str] = None  # int8 | int4 | fp8 | nf4; None: float weights (plain LoRA)
    act_qtype: Optional[str] = None  # int8 | int4 | fp8; None: float activations (weight-only)
    tile_size: Optional[int] = None  # sub-channel scales per tile of the contraction dim (must divide it)
    weight_calibration: str = "absmax"  # Qwix: absmax[,s] | minmax[,s] | rms,s | fixed,lo,hi
    act_calibration: str = "absmax"  # likewise, for activation scales (PTQ: calibrated on data)
    rank: int = 8  # LoRA rank (method=lora only)
    alpha: float = 16.0  # LoRA scale: the adapter adds (alpha / rank) * x A B (method=lora only)


@dataclass
class QuantizationConfig:
    name: str = "none"
    # none | qat (fake-quantized forward, float params train) | ptq (post-training: python -m stack.tools.quantize)
    # | lora (frozen base, quantized when a rule has weight_qtype: QLoRA)
    method: str = "none"
    rules: List[QuantRule] = field(default_factory=list)
    calibration_batches: int = 8  # PTQ: batches whose activations set the static activation scales
