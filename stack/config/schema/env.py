"""Schema of the `env` group: the environment of GRPO's multi-turn rollouts (stack.rewards.environment),
or none (single-turn completions)."""

from dataclasses import dataclass
from typing import ClassVar, Optional


@dataclass
class EnvConfig:
    """Null keys: the defaults (env=none is all null, so a run saved before the group existed resumes)."""

    builtins: ClassVar[tuple[str, ...]] = ("calculator",)  # stack.rewards.group.ENVIRONMENTS
    defaults: ClassVar[dict[str, float]] = {"max_turns": 4, "weight": 1.0, "timeout": 30.0}
    name: str = "none"
    # a built-in environment, or `pkg.module.Class` whose package is in allow_targets; null: single-turn
    environment: Optional[str] = None
    max_turns: Optional[int] = None  # model turns per trajectory; null: 4
    weight: Optional[float] = None  # the environment's reward beside reward.functions' (rewards/env/mean); null: 1.0
    timeout: Optional[float] = None  # seconds a batch of resets or steps may take before its trajectories end; null: 30
