"""Schemas of the `algorithm` group: one dataclass per algorithm, chosen by the option.

Each schema also answers, without importing jax, what validation asks of its algorithm:
`data_kinds` (the `data.kind`s it reads) and `check(node, cfg)` (its own rules, raising
ConfigError). `stack.validate` calls these; it never tests an algorithm's name.
"""

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from stack.errors import ConfigError, bad_choice
from stack.quant.config import has_adapters


@dataclass
class AlgorithmConfig:
    name: str = "sft"
    _target_: str = "stack.algorithms.sft.SFT"
    data_kinds: ClassVar[tuple[str, ...]] = ("sft", "text")
    objective: ClassVar[str] = "eval/loss"  # what trainer.objective means when it is null

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
        if node.reference.init_from and has_adapters(cfg.quantization):
            raise ConfigError(
                f"'algorithm.reference.init_from'={node.reference.init_from!r} cannot be combined with "
                f"quantization={cfg.quantization.name}: with adapters the reference is the base model with "
                "its adapters off. Drop one of the two.")


@dataclass
class GRPOConfig(AlgorithmConfig):
    """Group-relative policy optimisation (stack/algorithms/grpo.py; TRL GRPOTrainer 1.x)."""

    name: str = "grpo"
    _target_: str = "stack.algorithms.grpo.GRPO"
    num_generations: int = 8  # G completions per prompt
    max_new_tokens: int = 8  # TRL max_completion_length
    temperature: float = 1.0  # sampling, and the training log-probs (as TRL)
    top_k: int = 0  # 0: off; training with top-k/top-p is refused (the log-probs would differ)
    top_p: float = 1.0
    beta: float = 0.0  # KL coefficient; 0: no reference model is built
    kl_estimator: str = "k3"  # k1 | k2 | k3 (in the loss, as TRL)
    epsilon: float = 0.2  # clip range (low)
    epsilon_high: Optional[float] = None  # None: = epsilon; DAPO clip-higher e.g. 0.28
    loss_type: str = "dapo"  # grpo | dr_grpo | dapo | bnpo
    scale_rewards: str = "group"  # group | batch | none
    num_iterations: int = 1  # mu: passes over each generation batch
    steps_per_generation: int = 1  # optimizer steps (minibatches) per generation batch
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    data_kinds: ClassVar[tuple[str, ...]] = ("prompt",)
    objective: ClassVar[str] = "eval/reward"
    loss_types: ClassVar[tuple[str, ...]] = ("grpo", "dr_grpo", "dapo", "bnpo")

    @staticmethod
    def check(node: Any, cfg: Any) -> None:
        for key, allowed in (("loss_type", GRPOConfig.loss_types), ("scale_rewards", ("group", "batch", "none")),
                             ("kl_estimator", ("k1", "k2", "k3"))):
            if node[key] not in allowed:
                raise bad_choice(f"algorithm.{key}", node[key], allowed)
        for key in ("num_generations", "max_new_tokens", "num_iterations", "steps_per_generation"):
            if node[key] < (2 if key == "num_generations" else 1):
                raise ConfigError(f"'algorithm.{key}'={node[key]} must be >= {2 if key == 'num_generations' else 1}"
                                  + (" (advantages compare completions of the same prompt)." if key == "num_generations"
                                     else "."))
        if not node.temperature > 0:
            raise ConfigError(f"'algorithm.temperature'={node.temperature} must be > 0: GRPO trains on samples.")
        if node.top_k or node.top_p < 1.0:
            raise ConfigError(
                f"'algorithm.top_k'={node.top_k} / 'algorithm.top_p'={node.top_p}: training on top-k/top-p samples "
                "needs the same truncated distribution in the loss, which GRPO here does not build; keep top_k=0 "
                "and top_p=1.0 (python -m stack.generate samples with filters).")
        if not node.epsilon > 0 or (node.epsilon_high is not None and node.epsilon_high < node.epsilon):
            raise ConfigError(f"'algorithm.epsilon'={node.epsilon} must be > 0 and 'algorithm.epsilon_high'="
                              f"{node.epsilon_high} null or >= epsilon.")
        if node.beta < 0:
            raise ConfigError(f"'algorithm.beta'={node.beta} must be >= 0.")
        if cfg.reward.init_from is not None:
            raise ConfigError(f"'reward.init_from'={cfg.reward.init_from!r}: GRPO here scores with rule functions "
                              "(reward=rules); a reward model scores PPO's completions (algorithm=ppo).")
        check_rounds(node, cfg, node.num_iterations * node.steps_per_generation,
                     "num_iterations x steps_per_generation")


def check_rounds(node: Any, cfg: Any, steps: int, what: str) -> None:
    """An on-policy run's shape: whole rounds of `steps` optimizer steps, prompt + completion in the model."""
    if cfg.trainer.steps % steps:
        raise ConfigError(f"'trainer.steps'={cfg.trainer.steps} must be a multiple of {what} = {steps} "
                          "(checkpoints fall on rollout rounds).")
    if cfg.data.seq_len + node.max_new_tokens > cfg.model.max_seq_len:
        raise ConfigError(f"'data.seq_len'={cfg.data.seq_len} (the prompt) + 'algorithm.max_new_tokens'="
                          f"{node.max_new_tokens} exceeds 'model.max_seq_len'={cfg.model.max_seq_len}.")
