"""Schemas of the RLHF options of the `algorithm` group: a reward model (rm) and PPO."""

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from stack.config.quantization import has_adapters
from stack.config.schema.algorithm import AlgorithmConfig, ReferenceConfig, check_rounds
from stack.errors import ConfigError, bad_choice


@dataclass
class RMConfig(AlgorithmConfig):
    """A Bradley–Terry reward model (stack/algorithms/rm.py; TRL RewardTrainer 1.x)."""

    name: str = "rm"
    _target_: str = "stack.algorithms.rm.RewardModel"
    center_rewards_coefficient: float = 0.0  # TRL's; 0 (TRL: None) adds nothing
    data_kinds: ClassVar[tuple[str, ...]] = ("preference",)
    objective: ClassVar[str] = "eval/accuracy"

    @staticmethod
    def check(node: Any, cfg: Any) -> None:
        if node.center_rewards_coefficient < 0:
            raise ConfigError(f"'algorithm.center_rewards_coefficient'={node.center_rewards_coefficient} "
                              "must be >= 0.")


@dataclass
class PPOConfig(AlgorithmConfig):
    """PPO with a value model, GAE and KL control (stack/algorithms/ppo.py; TRL PPOTrainer 0.2x)."""

    name: str = "ppo"
    _target_: str = "stack.algorithms.ppo.PPO"
    max_new_tokens: int = 8  # TRL response_length
    temperature: float = 0.7  # sampling, and the training logits (as TRL)
    kl_coef: float = 0.05  # the initial coefficient when adaptive
    kl_estimator: str = "k1"  # k1 | k3 (TRL's kl_estimator)
    adaptive_kl: bool = False  # Ziegler et al.'s controller: target_kl, horizon
    target_kl: float = 6.0
    horizon: float = 10000.0
    missing_eos_penalty: Optional[float] = None  # subtracted from the score of a completion without EOS
    gamma: float = 1.0
    lam: float = 0.95
    whiten_rewards: bool = False
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1
    num_ppo_epochs: int = 4
    num_mini_batches: int = 1
    # null: true with LoRA (adapters stay the only trained trunk params), else false
    shared_trunk: Optional[bool] = None
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    data_kinds: ClassVar[tuple[str, ...]] = ("prompt",)
    objective: ClassVar[str] = "eval/reward"
    samples_at_eval: ClassVar[bool] = True

    @staticmethod
    def check(node: Any, cfg: Any) -> None:
        if node.kl_estimator not in ("k1", "k3"):
            raise bad_choice("algorithm.kl_estimator", node.kl_estimator, ("k1", "k3"))
        for key in ("max_new_tokens", "num_ppo_epochs", "num_mini_batches"):
            if node[key] < 1:
                raise ConfigError(f"'algorithm.{key}'={node[key]} must be >= 1.")
        for key in ("temperature", "cliprange", "cliprange_value", "target_kl", "horizon"):
            if not node[key] > 0:
                raise ConfigError(f"'algorithm.{key}'={node[key]} must be > 0.")
        for key in ("gamma", "lam"):
            if not 0.0 <= node[key] <= 1.0:
                raise ConfigError(f"'algorithm.{key}'={node[key]} must be in [0, 1].")
        if node.kl_coef < 0 or node.vf_coef < 0:
            raise ConfigError(f"'algorithm.kl_coef'={node.kl_coef} and "
                              f"'algorithm.vf_coef'={node.vf_coef} must be >= 0.")
        check_rounds(node, cfg, node.num_ppo_epochs * node.num_mini_batches, "num_ppo_epochs x num_mini_batches")
        if node.shared_trunk is False and has_adapters(cfg.quantization):
            raise ConfigError(f"'algorithm.shared_trunk'=false with quantization={cfg.quantization.name} would "
                              "train a full value trunk beside the adapters; use shared_trunk=true (or null) "
                              "with LoRA.")
