"""Schemas of the `algorithm` group: one dataclass per algorithm, chosen by the option."""

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class AlgorithmConfig:
    name: str = "sft"
    _target_: str = "stack.algorithms.sft.SFT"


@dataclass
class SFTConfig(AlgorithmConfig):
    name: str = "sft"
    _target_: str = "stack.algorithms.sft.SFT"
    # "mean": average over completion tokens of the batch; "sum": plain sum.
    loss_reduction: str = "mean"


@dataclass
class ReferenceConfig:
    # None: the initial policy (with LoRA: the base model with adapters off); else a checkpoints dir
    init_from: Optional[str] = None


@dataclass
class DPOConfig(AlgorithmConfig):
    name: str = "dpo"
    _target_: str = "stack.algorithms.dpo.DPO"
    beta: float = 0.1
    loss_type: str = "sigmoid"  # sigmoid | hinge | ipo | robust (stack/algorithms/dpo.py)
    label_smoothing: float = 0.0  # sigmoid (cDPO) and robust; 0 <= eps < 0.5
    sft_weight: float = 0.0  # + weight x NLL of the chosen completions (TRL's rpo_alpha)
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    # true: reference log-probs computed once before training, stored with the data state
    precompute_reference: bool = False
