"""The Experiment: everything the trainer needs, built from one config by stack.run.build."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from omegaconf import DictConfig

from stack.algorithms.base import Algorithm
from stack.checkpoint.manager import Checkpointer
from stack.data.tokenizers import Tokenizer
from stack.engine.precompile import Precompile
from stack.hardware.compile_cache import machine_file
from stack.hardware.platform import peak_flops_per_device
from stack.logging.sinks import Sink
from stack.quant.providers import Lora, NoQuantization, Qat
from stack.rewards.env_runner import EnvRunner
from stack.rewards.model import ModelReward
from stack.rewards.runner import RewardRunner


@dataclass(frozen=True)
class Experiment:
    """Everything the trainer needs, built from one config. Nothing in it changes during a
    run: what does lives in the TrainState (stack.engine.step) or the trainer."""

    cfg: DictConfig
    run_dir: str
    mesh: jax.sharding.Mesh
    rules: tuple[tuple[str, Any], ...]
    model: nnx.Module  # the policy, as built (quantization applied); its arrays seed the TrainState
    quant: NoQuantization | Qat | Lora  # the quantization provider (stack.quant.providers)
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    algorithm: Algorithm
    tokenizer: Tokenizer
    train_batches: Iterable[dict[str, np.ndarray]]
    eval_batches: tuple[dict[str, np.ndarray], ...]
    flops_per_token: float  # training FLOPs per token (stack.hardware.platform, MaxText's formula)
    sinks: tuple[Sink, ...] = ()
    checkpointer: Checkpointer | None = None  # None: shape-only (validate / compile)
    wandb_id: str | None = None
    rewards: RewardRunner | ModelReward | None = None  # the `reward` group (rule functions or a reward model)
    precompiled: Precompile | None = None  # the first round's program, compiled during the model init
    env: EnvRunner | None = None  # the `env` group: GRPO's multi-turn environments (None: single-turn)

    @cached_property
    def peak_flops_per_device(self) -> float:
        """MFU's denominator, on first use: on CPU the matmul probe (once per machine), which the
        trainer asks for right after the first step (stack.engine.trainer.metrics.PeakProbe)."""
        return peak_flops_per_device(self.cfg.hardware, machine_file("cpu_peak"), self.mesh.size)
