"""Schema of the composed config's own keys (everything that is not a group)."""

from dataclasses import dataclass, field
from typing import Any, List, Optional

from stack.config.schema.logger import LoggerConfig


@dataclass
class TrainerConfig:
    steps: int = 200  # optimizer steps
    grad_accum: int = 1  # micro-batches per optimizer step (gradients summed, divided once)
    log_every: int = 10  # the only steps where metrics leave the device
    eval_every: int = 50  # 0: only at the start and the end
    eval_batches: int = 4
    # the metric a multirun job returns to the sweeper; null: the algorithm's (eval/loss, GRPO: eval/reward)
    objective: Optional[str] = None
    nan_policy: str = "stop"  # stop | ignore
    # XLA's persistent compilation cache: auto (<user cache>/stack/jax, stack/hardware/compile_cache.py), off, or a dir
    compilation_cache: Optional[str] = "auto"
    profile: Optional[List[int]] = None  # [START, STOP]: a jax.profiler trace of those steps in <run_dir>/profile


@dataclass
class EvalConfig:
    """Sampled evaluation of GRPO and PPO (stack.algorithms.sampled_eval); null keys: off or the default."""

    num_samples: Optional[int] = None  # n sampled completions per eval prompt beside the greedy one: pass@k, maj@k
    temperature: Optional[float] = None  # of those samples; null: algorithm.temperature
    correct: Optional[str] = None  # the reward function whose score >= 1 marks a right answer; null: accuracy


@dataclass
class RolloutConfig:
    """How GRPO and PPO generate (stack.rollout); null keys: the defaults."""

    engine: Optional[str] = None  # static (null): one KV cache row per completion | paged: continuous batching
    slots: Optional[int] = None  # paged: rows decoded together; null: every row of the generation batch
    page_size: Optional[int] = None  # paged: tokens per KV page; null: 16
    pages: Optional[int] = None  # paged: the page pool, scratch included; null: every slot's longest request


@dataclass
class WarmStartConfig:
    """A first stage trained when `model.init_from` is not set (e.g. SFT before GRPO)."""

    recipe: Optional[str] = None  # a recipe name; null: no warm start
    overrides: List[str] = field(default_factory=list)  # extra overrides of that stage
    # where warm starts are kept, one dir per stage config (<dir>/<key>), shared by every run that
    # asks for the same one; null: <cache root>/warm_starts (stack.run.warm_start)
    dir: Optional[str] = None


@dataclass
class SweepConfig:
    # the metric a sweep optimizes (hydra/sweeper=optuna) and reports; null: trainer.objective
    objective: Optional[str] = None


@dataclass
class Config:
    model: Any = None
    mesh: Any = None
    optimizer: Any = None
    quantization: Any = None
    data: Any = None
    checkpoint: Any = None
    hardware: Any = None
    algorithm: Any = None
    reward: Any = None
    env: Any = None
    logger: LoggerConfig = field(default_factory=LoggerConfig)  # a list group: its options only set flags
    launcher: Any = None
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    seed: int = 0
    mode: str = "train"  # train | compile | validate
    run_dir: Optional[str] = None  # None: Hydra's output dir
    # `_target_` prefixes honoured besides stack., optax., flax., jax., qwix., grain., orbax.
    allow_targets: List[str] = field(default_factory=list)
