"""Schemas of the `algorithm` group: one dataclass per algorithm, chosen by the option.

Each schema also answers, without importing jax, what validation asks of its algorithm:
`data_kinds` (the `data.kind`s it reads) and `check(node, cfg)` (its own rules, raising
ConfigError). `stack.config.validate` calls these; it never tests an algorithm's name.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from stack.config.quantization import has_adapters
from stack.errors import ConfigError, bad_choice, short


@dataclass
class AlgorithmConfig:
    name: str = "sft"
    _target_: str = "stack.algorithms.sft.SFT"
    data_kinds: ClassVar[tuple[str, ...]] = ("sft", "text")
    objective: ClassVar[str] = "eval/loss"  # what trainer.objective means when it is null
    shared_prompt_rows: ClassVar[bool] = False  # reads data.share_prompt's one-row pairs
    samples_at_eval: ClassVar[bool] = False  # its eval generates (the `eval` keys: stack.config.sampled_eval)

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
    # None: the initial policy (with LoRA: the base model with adapters off); else a run's
    # checkpoints dir or hf:DIR (a local Hugging Face Llama)
    init_from: Optional[str] = None


@dataclass
class DPOConfig(AlgorithmConfig):
    """Direct preference optimisation (stack/algorithms/dpo.py; the losses: stack/algorithms/dpo_losses.py)."""

    name: str = "dpo"
    _target_: str = "stack.algorithms.dpo.DPO"
    beta: float = 0.1
    loss_type: Any = "sigmoid"  # a name of `loss_types` or a list of them (TRL 1.x: combined by loss_weights)
    loss_weights: Any = None  # one weight per loss_type entry; null: 1 each (TRL); loss = sum of weight x loss
    # eps of sigmoid (cDPO; ignored with trl_compat, as TRL), robust, aot, aot_unpaired, exo_pair; 0 <= eps < 0.5
    label_smoothing: float = 0.0
    discopop_tau: float = 0.05  # tau of loss_type discopop (TRL's default)
    f_divergence_type: str = "reverse_kl"  # reverse_kl | forward_kl | js_divergence | alpha_divergence (f-DPO)
    f_alpha_divergence_coef: float = 0.5  # alpha of alpha_divergence
    # true: TRL 1.16 exactly: sigmoid ignores label_smoothing; ipo logs rewards/* from summed log-ratios
    trl_compat: bool = False
    # + weight x NLL of the chosen completions (TRL <= 0.28 rpo_alpha; since 0.29: loss_type sft)
    sft_weight: float = 0.0
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    # true: reference log-probs computed once before training, stored with the data state
    precompute_reference: bool = False
    data_kinds: ClassVar[tuple[str, ...]] = ("preference",)
    shared_prompt_rows: ClassVar[bool] = True
    loss_types: ClassVar[tuple[str, ...]] = (
        "sigmoid", "hinge", "ipo", "robust", "exo_pair", "nca_pair", "bco_pair", "sppo_hard", "aot", "aot_unpaired",
        "apo_zero", "apo_down", "discopop", "sigmoid_norm", "sft")
    f_divergence_types: ClassVar[tuple[str, ...]] = ("reverse_kl", "forward_kl", "js_divergence", "alpha_divergence")
    # the losses of the chosen-minus-rejected score, the only ones a non-default f applies to (TRL)
    f_divergence_losses: ClassVar[tuple[str, ...]] = (
        "sigmoid", "sigmoid_norm", "hinge", "ipo", "exo_pair", "robust", "discopop", "sft")

    @staticmethod
    def check(node: Any, cfg: Any) -> None:
        types = dpo_loss_types(node.loss_type)
        check_dpo_weights(node.loss_weights, types)
        if not node.beta > 0:
            raise ConfigError(f"'algorithm.beta'={node.beta} must be > 0.")
        check_dpo_smoothing(node, types)
        check_dpo_divergence(node, types)
        if node.reference.init_from and has_adapters(cfg.quantization):
            raise ConfigError(
                f"'algorithm.reference.init_from'={node.reference.init_from!r} cannot be combined with "
                f"quantization={cfg.quantization.name}: with adapters the reference is the base model with "
                "its adapters off. Drop one of the two.")


def dpo_loss_types(value: Any) -> list[str]:
    """`algorithm.loss_type` as a list of known names (a single name is a list of one)."""
    if isinstance(value, str):
        names, keys = [value], ["algorithm.loss_type"]
    elif isinstance(value, Sequence) and len(value):
        names, keys = list(value), [f"algorithm.loss_type.{i}" for i in range(len(value))]
    else:
        raise ConfigError(f"'algorithm.loss_type'={short(repr(value))}: expected a loss type or a non-empty list "
                          f"of them, e.g. [sigmoid,bco_pair]; available: {', '.join(DPOConfig.loss_types)}.")
    for key, name in zip(keys, names, strict=True):
        if name not in DPOConfig.loss_types:
            raise bad_choice(key, name, DPOConfig.loss_types)
    return names


def check_dpo_weights(weights: Any, types: list[str]) -> None:
    """`algorithm.loss_weights`: null, or one finite number >= 0 per loss type."""
    if weights is None:
        return
    if isinstance(weights, str) or not isinstance(weights, Sequence):
        raise ConfigError(f"'algorithm.loss_weights'={short(repr(weights))}: expected a list of numbers, one per "
                          f"'algorithm.loss_type' entry ({types}), or null for 1 each.")
    if len(weights) != len(types):
        n, m = len(weights), len(types)
        raise ConfigError(f"'algorithm.loss_weights'={short(list(weights))} has {n} weight{'s' * (n != 1)} for "
                          f"the {m} loss type{'s' * (m != 1)} {types} of 'algorithm.loss_type': give one weight per "
                          "loss type, or null for 1 each.")
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ConfigError(f"'algorithm.loss_weights.{i}'={short(repr(w))} must be a finite number >= 0 "
                              f"(the weight of loss_type {types[i]!r}).")


def check_dpo_smoothing(node: Any, types: list[str]) -> None:
    """`algorithm.label_smoothing`: in [0, 0.5), used by one of the loss types, > 0 for exo_pair."""
    eps = node.label_smoothing
    if not 0.0 <= eps < 0.5:
        raise ConfigError(f"'algorithm.label_smoothing'={eps} must be in [0, 0.5).")
    users = ("robust", "aot", "aot_unpaired", "exo_pair") + (() if node.trl_compat else ("sigmoid",))
    if eps and not set(users) & set(types):
        raise ConfigError(f"'algorithm.label_smoothing'={eps} applies to loss_type {', '.join(users)} "
                          f"(sigmoid only without trl_compat, as TRL 1.16 ignores it there), not {types}.")
    if "exo_pair" in types and not eps > 0:
        raise ConfigError(f"'algorithm.label_smoothing'={eps}: loss_type exo_pair needs eps in (0, 0.5) (the EXO "
                          "paper recommends 1e-3; TRL refuses 0 likewise).")


def check_dpo_divergence(node: Any, types: list[str]) -> None:
    """`algorithm.f_divergence_type` and its coefficient; `algorithm.discopop_tau`."""
    kind = node.f_divergence_type
    if kind not in DPOConfig.f_divergence_types:
        raise bad_choice("algorithm.f_divergence_type", kind, DPOConfig.f_divergence_types)
    others = [t for t in types if t not in DPOConfig.f_divergence_losses]
    if kind != "reverse_kl" and others:
        raise ConfigError(f"'algorithm.f_divergence_type'={kind!r} does not apply to loss_type {others}: only "
                          f"{', '.join(DPOConfig.f_divergence_losses)} are losses of the chosen-minus-rejected "
                          "score (TRL 1.16 refuses the others too). Use reverse_kl with them.")
    if not math.isfinite(node.f_alpha_divergence_coef):
        raise ConfigError(f"'algorithm.f_alpha_divergence_coef'={node.f_alpha_divergence_coef} must be finite.")
    if not node.discopop_tau > 0:
        raise ConfigError(f"'algorithm.discopop_tau'={node.discopop_tau} must be > 0 (TRL's default 0.05).")


@dataclass
class GRPOConfig(AlgorithmConfig):
    """Group-relative policy optimisation (stack/algorithms/grpo.py; TRL GRPOTrainer 1.x)."""

    name: str = "grpo"
    _target_: str = "stack.algorithms.grpo.GRPO"
    num_generations: int = 8  # G completions per prompt
    max_new_tokens: int = 8  # TRL max_completion_length
    temperature: float = 1.0  # sampling, and the training log-probs (as TRL)
    top_k: int = 0  # sampling only, as TRL: 0 off; the loss's log-probs are of the unfiltered distribution
    top_p: float = 1.0  # in (0, 1]; 1: off (sampling only, as top_k)
    beta: float = 0.0  # KL coefficient; 0: no reference model is built
    kl_estimator: str = "k3"  # k1 | k2 | k3 (in the loss, as TRL)
    use_bias_correction_kl: bool = True  # TRL 1.16's default: the KL term times the importance ratio
    epsilon: float = 0.2  # clip range (low)
    epsilon_high: Optional[float] = None  # None: = epsilon; DAPO clip-higher e.g. 0.28; cispo: the ratio's cap
    loss_type: str = "dapo"  # grpo | dr_grpo | dapo | bnpo | cispo | sapo
    sapo_temperature_pos: float = 1.0  # sapo's gate temperature where the advantage is > 0 (TRL's default)
    sapo_temperature_neg: float = 1.05  # and where it is <= 0
    scale_rewards: str = "group"  # group | batch | none
    advantage: str = "grpo"  # grpo (group mean/std) | rloo (leave-one-out) | reinforce_pp (REINFORCE++)
    num_iterations: int = 1  # mu: passes over each generation batch
    steps_per_generation: int = 1  # optimizer steps (minibatches) per generation batch
    mask_truncated_completions: bool = False  # TRL's (DAPO): no loss on completions without EOS
    overlong_interval: int = 0  # DAPO's soft overlong punishment over the last N of max_new_tokens; 0: off
    overlong_factor: float = 1.0  # its weight in the reward
    dynamic_sampling: bool = False  # DAPO's: more generation batches until every group's rewards differ
    max_generation_batches: int = 4  # of a round with dynamic_sampling (then it trains on what it has)
    # TRL's: null or token: a ratio per token; sequence: one per completion (GSPO), its tokens' mean log-ratio
    importance_sampling_level: Optional[str] = None
    delta: Optional[float] = None  # TRL's two-sided clipping: the unclipped ratio capped at delta (> 1 + epsilon_high)
    # TRL's: in (0, 1]; the loss on the top q of tokens by entropy; null: 1
    top_entropy_quantile: Optional[float] = None
    # sampler/trainer mismatch (TRL's vllm_importance_sampling_*): none | token_truncate | token_mask |
    # sequence_truncate | sequence_mask, with the ratio's cap (C_max) and floor (C_min)
    is_correction: str = "none"
    is_cap: Optional[float] = 3.0
    is_floor: Optional[float] = None
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    data_kinds: ClassVar[tuple[str, ...]] = ("prompt",)
    objective: ClassVar[str] = "eval/reward"
    samples_at_eval: ClassVar[bool] = True
    loss_types: ClassVar[tuple[str, ...]] = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo")

    @staticmethod
    def check(node: Any, cfg: Any) -> None:
        for key, allowed in (("loss_type", GRPOConfig.loss_types), ("scale_rewards", ("group", "batch", "none")),
                             ("kl_estimator", ("k1", "k2", "k3"))):
            if node[key] not in allowed:
                raise bad_choice(f"algorithm.{key}", node[key], allowed)
        if node.importance_sampling_level not in (None, "token", "sequence"):
            raise bad_choice("algorithm.importance_sampling_level", node.importance_sampling_level,
                             ("token", "sequence"))
        for key in ("num_generations", "max_new_tokens", "num_iterations", "steps_per_generation"):
            if node[key] < (2 if key == "num_generations" else 1):
                raise ConfigError(f"'algorithm.{key}'={node[key]} must be >= {2 if key == 'num_generations' else 1}"
                                  + (" (advantages compare completions of the same prompt)." if key == "num_generations"
                                     else "."))
        if not node.temperature > 0:
            raise ConfigError(f"'algorithm.temperature'={node.temperature} must be > 0: GRPO trains on samples.")
        if node.top_k < 0 or not 0 < node.top_p <= 1:
            raise ConfigError(f"'algorithm.top_k'={node.top_k} / 'algorithm.top_p'={node.top_p}: top_k must be >= 0 "
                              "(0: off) and top_p in (0, 1] (1.0: off).")
        if not node.epsilon > 0 or (node.epsilon_high is not None and node.epsilon_high < node.epsilon):
            raise ConfigError(f"'algorithm.epsilon'={node.epsilon} must be > 0 and 'algorithm.epsilon_high'="
                              f"{node.epsilon_high} null or >= epsilon.")
        if node.beta < 0:
            raise ConfigError(f"'algorithm.beta'={node.beta} must be >= 0.")
        if node.top_entropy_quantile is not None and not 0 < node.top_entropy_quantile <= 1:
            raise ConfigError(f"'algorithm.top_entropy_quantile'={node.top_entropy_quantile}: null or in (0, 1], the "
                              "fraction of tokens (highest entropy first) the loss keeps; 1 or null: every token.")
        check_loss_type(node)
        if node.delta is not None and not node.delta > 1:
            raise ConfigError(f"'algorithm.delta'={node.delta} caps the importance ratio: null (off) or > 1 "
                              "(TRL recommends > 1 + epsilon_high).")
        check_rounds(node, cfg, node.num_iterations * node.steps_per_generation,
                     "num_iterations x steps_per_generation")


def check_loss_type(node: Any) -> None:
    """cispo's cap, sapo's temperatures and the mismatch correction (TRL GRPOConfig's meanings)."""
    if node.loss_type == "cispo" and (node.epsilon_high is None or node.epsilon_high <= 1):
        raise ConfigError(
            f"algorithm.loss_type=cispo caps each token's importance ratio at algorithm.epsilon_high (ε_max), which "
            f"is {node.epsilon_high}; it must be set and > 1. TRL's fallback (epsilon_high = epsilon = 0.2) would "
            "scale every token's gradient by at most 0.2; ScaleRL recommends algorithm.epsilon_high=5.0.")
    if node.advantage not in ("grpo", "rloo", "reinforce_pp"):
        raise bad_choice("algorithm.advantage", node.advantage, ("grpo", "rloo", "reinforce_pp"))
    if node.advantage != "grpo" and node.scale_rewards == "group":
        raise ConfigError(
            f"algorithm.advantage={node.advantage} with algorithm.scale_rewards=group: the group's std is GRPO's "
            "scale. rloo takes none (TRL RLOOTrainer's default) or batch (its normalize_advantages); reinforce_pp "
            "whitens over the batch's tokens itself: set algorithm.scale_rewards=none.")
    if node.advantage == "reinforce_pp" and node.scale_rewards != "none":
        raise ConfigError("algorithm.advantage=reinforce_pp whitens its returns over the batch's tokens itself: "
                          f"set algorithm.scale_rewards=none (it is {node.scale_rewards}).")
    modes = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
    if node.is_correction not in modes:
        raise bad_choice("algorithm.is_correction", node.is_correction, modes)
    if not 0 <= node.overlong_interval <= node.max_new_tokens:
        raise ConfigError(f"'algorithm.overlong_interval'={node.overlong_interval}: DAPO's punishment interval, the "
                          f"last N tokens of algorithm.max_new_tokens={node.max_new_tokens}; 0 (off) up to "
                          "max_new_tokens.")
    if node.max_generation_batches < 1:
        raise ConfigError(f"'algorithm.max_generation_batches'={node.max_generation_batches} must be >= 1.")
    cap, floor = node.is_cap, node.is_floor
    if (floor is not None and floor < 0) or (cap is not None and cap <= (floor or 0)):
        raise ConfigError(f"'algorithm.is_cap'={cap} and 'algorithm.is_floor'={floor}: the sampler/trainer ratio is "
                          "kept within [is_floor, is_cap] (null: no bound); the floor must be >= 0, the cap above it.")
    if not (node.sapo_temperature_pos > 0 and node.sapo_temperature_neg > 0):
        raise ConfigError(f"'algorithm.sapo_temperature_pos'={node.sapo_temperature_pos} and "
                          f"'algorithm.sapo_temperature_neg'={node.sapo_temperature_neg} must be > 0.")


def check_rounds(node: Any, cfg: Any, steps: int, what: str) -> None:
    """An on-policy run's shape: whole rounds of `steps` optimizer steps, prompt + completion in the model."""
    if cfg.trainer.steps % steps:
        raise ConfigError(f"'trainer.steps'={cfg.trainer.steps} must be a multiple of {what} = {steps} "
                          "(checkpoints fall on rollout rounds).")
    if cfg.data.seq_len + node.max_new_tokens > cfg.model.max_seq_len:
        raise ConfigError(f"'data.seq_len'={cfg.data.seq_len} (the prompt) + 'algorithm.max_new_tokens'="
                          f"{node.max_new_tokens} exceeds 'model.max_seq_len'={cfg.model.max_seq_len}.")
