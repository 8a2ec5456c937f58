"""Schemas of the `algorithm` group: one dataclass per algorithm, chosen by the option.

Each schema also answers, without importing jax, what validation asks of its algorithm:
`data_kinds` (the `data.kind`s it reads) and `check(node, cfg)` (its own rules, raising
ConfigError). `stack.validate` calls these; it never tests an algorithm's name.
"""

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from stack.errors import ConfigError, bad_choice


@dataclass
class AlgorithmConfig:
    name: str = "sft"
    _target_: str = "stack.algorithms.sft.SFT"
    data_kinds: ClassVar[tuple[str, ...]] = ("sft", "text")

    @staticmethod
    def check(node: Any, cfg: Any) -> None:
        """Raise ConfigError when `node` (this algorithm's config) cannot run in `cfg`."""


@dataclass
class SFTConfig(AlgorithmConfig):
    name: str = "sft"
    _target_: str = "stack.algorithms.sft.SFT"
    # "mean": average over completion tokens of the batch; "sum": plain sum.
    loss_reduction: str = "mean"

    @staticmethod
    def check(node: Any, cfg: Any) -> None:
        if node.loss_reduction not in ("mean", "sum"):
            raise bad_choice("algorithm.loss_reduction", node.loss_reduction, ("mean", "sum"))


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
    data_kinds: ClassVar[tuple[str, ...]] = ("preference",)
    loss_types: ClassVar[tuple[str, ...]] = ("sigmoid", "hinge", "ipo", "robust")

    @staticmethod
    def check(node: Any, cfg: Any) -> None:
        if node.loss_type not in DPOConfig.loss_types:
            raise bad_choice("algorithm.loss_type", node.loss_type, DPOConfig.loss_types)
        if not node.beta > 0:
            raise ConfigError(f"'algorithm.beta'={node.beta} must be > 0.")
        if not 0.0 <= node.label_smoothing < 0.5:
            raise ConfigError(f"'algorithm.label_smoothing'={node.label_smoothing} must be in [0, 0.5).")
        if node.label_smoothing and node.loss_type not in ("sigmoid", "robust"):
            raise ConfigError(f"'algorithm.label_smoothing' applies to loss_type sigmoid or robust, "
                              f"not {node.loss_type!r}.")
        if node.reference.init_from and cfg.quantization.method == "lora":
            raise ConfigError(
                f"'algorithm.reference.init_from'={node.reference.init_from!r} cannot be combined with "
                "quantization.method=lora: with LoRA the reference is the base model with its adapters off. "
                "Drop one of the two.")
