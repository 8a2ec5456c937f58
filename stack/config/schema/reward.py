"""Schema of the `reward` group: rule functions (or a user's, by import path) and their weights,
or a trained reward model (`init_from`)."""

from dataclasses import dataclass, field
from typing import ClassVar, List, Optional


@dataclass
class RewardConfig:
    rules: ClassVar[tuple[str, ...]] = ("accuracy", "digits", "format", "length")  # stack.rewards.functions.RULES
    name: str = "rules"
    # built-in `rules` (stack/rewards/functions.py) or `pkg.module.fn`,
    # a function (prompts, completions, **record) -> list[float | None] whose package is in allow_targets
    functions: List[str] = field(default_factory=lambda: ["accuracy"])
    # TRL reward_weights, one per function then the reward model's; null: 1.0 each
    weights: Optional[List[float]] = None
    init_from: Optional[str] = None  # reward=model: an algorithm=rm run's checkpoints, or hf:DIR (beside any functions)
    timeout: float = 30.0  # seconds a function may take per batch before its samples score NaN
    format_pattern: str = r"\s*-?\d+\s*"  # `format`: a regex the whole completion must match
    max_length: int = 64  # `length`: characters at which the penalty reaches -1
