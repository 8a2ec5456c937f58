"""Config -> objects. The only caller of `hydra.utils.instantiate` in the project.

Order: hardware -> mesh -> algorithm -> data -> quantization -> optimizer -> checkpoint (the resume point) ->
model -> rewards -> loggers. Every check that needs no model comes before the model is built.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from stack.algorithms.base import Algorithm
from stack.checkpoint import Checkpointer
from stack.data.pipeline import Batches
from stack.data.tokenizers import Tokenizer, make_tokenizer
from stack.errors import ConfigError
from stack.cache import machine_file
from stack.hardware import check_platform, peak_flops_per_device, train_flops_per_token
from stack.host_fit import available_bytes, check_host_memory
from stack.logging.sinks import ConsoleSink, JsonlSink, Sink
from stack.models.hf import load_hf_weights
from stack.models.init import abstract_model, init_model
from stack.models.llama import unfuse
from stack.parallel import check_layout, logical_rules, make_mesh
from stack.precompile import Precompile
from stack.precompile import start as start_precompile
from stack.quant.providers import Lora, NoQuantization, Qat, make_quantization
from stack.rundir import check_not_completed
from stack.rewards import RewardRunner, make_rewards
from stack.rewards.model import ModelReward
from stack.saved_params import load_params
from stack.targets import check_targets


@dataclass(frozen=True)
class Experiment:
    """Everything the trainer needs, built from one config. Nothing in it changes during a
    run: what does lives in the TrainState (stack.step) or the trainer."""

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
    flops_per_token: float  # training FLOPs per token (stack.hardware, MaxText's formula)
    sinks: tuple[Sink, ...] = ()
    checkpointer: Checkpointer | None = None  # None: shape-only (validate / compile)
    wandb_id: str | None = None
    rewards: RewardRunner | ModelReward | None = None  # the `reward` group (rule functions or a reward model)
    precompiled: Precompile | None = None  # the first round's program, compiled during the model init

    @cached_property
    def peak_flops_per_device(self) -> float:
        """MFU's denominator, on first use: on CPU the matmul probe (once per machine), which the
        trainer asks for right after the first step (stack.trainer.metrics.PeakProbe)."""
        return peak_flops_per_device(self.cfg.hardware, machine_file("cpu_peak"), self.mesh.size)


def make_optimizer(cfg: Any) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The Optax chain from its YAML list, and the learning-rate schedule (for logging)."""
    schedule = instantiate(cfg.schedule) if cfg.schedule is not None else optax.constant_schedule(cfg.lr)
    transforms = []
    for i, node in enumerate(cfg.chain):
        try:
            transforms.append(instantiate(node, _convert_="all"))
        except Exception as exc:
            cause = exc.__cause__ or exc
            raise ConfigError(
                f"'optimizer.chain.{i}' ({node.get('_target_')}) cannot be built: {cause}. "
                "Check its keys against the Optax function's arguments."
            ) from exc
    if not transforms:
        raise ConfigError("'optimizer.chain' is empty: list at least one Optax transform.")
    return optax.chain(*transforms), schedule


def make_sinks(cfg: DictConfig, run_dir: str, group: str | None, name: str | None,
               wandb_id: str | None = None) -> tuple[Sink, ...]:
    """Loggers from the `logger` group (metrics.jsonl, console, wandb); process 0's only."""
    if jax.process_index() != 0:
        return ()
    log = cfg.logger
    sinks: list[Sink] = [ConsoleSink(cfg.trainer.steps, progress=log.progress)]
    if log.jsonl:
        sinks.append(JsonlSink(run_dir))
    if log.wandb and log.mode != "disabled":
        from stack.logging.wandb_sink import WandbSink

        config = OmegaConf.to_container(cfg, resolve=True)
        tags = (recipe_name(), cfg.hardware.name)
        sinks.append(WandbSink(log, run_dir, config, group=group, run_id=wandb_id, name=name,
                               job_type=cfg.algorithm.name, tags=tuple(t for t in tags if t)))
    return tuple(sinks)


def recipe_name() -> str | None:
    """The `+recipe=NAME` of the running Hydra job, if any."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.choices.get("recipe") if HydraConfig.initialized() else None


def initial_model(cfg: DictConfig, abstract: bool = False) -> nnx.Module:
    """The model to train: random (`seed`), `model.init_from=hf:DIR` (a local HF Llama), or
    `model.init_from=RUN/checkpoints` (the params of another run's newest step)."""
    source = cfg.model.init_from
    if abstract or (source and source.startswith("hf:")):
        model = abstract_model(cfg.model)
        if not abstract:
            load_hf_weights(model, cfg.model, source)  # config.json shapes checked first
    else:
        model = init_model(cfg.model, cfg.seed)
        if source:
            load_params(model, source)
    # CPU speedups (the docstrings of MLP and Attention); elsewhere each projection is its own product
    return model if cfg.hardware.platform == "cpu" else unfuse(model)


def eval_too_small(data: DictConfig, records: int) -> ConfigError:
    """The error for an eval split of `records` records that fills no batch, naming where they come from."""
    if data.source == "synthetic":
        where, fix = f"the synthetic problems up to data.max_operand={data.max_operand}", "raise data.max_operand"
    elif data.eval_path:
        where, fix = f"data.eval_path={data.eval_path!r}", "add records to it"
    else:
        where = f"a seeded data.eval_fraction={data.eval_fraction} of data.path={data.path!r}"
        fix = "raise data.eval_fraction, give data.eval_path"
    return ConfigError(f"The eval split ({where}) holds {records} records and fills no batch of "
                       f"data.batch_size={data.batch_size}; {fix} or lower data.batch_size.")


def _splits(cfg: DictConfig, tokenizer: Tokenizer) -> tuple[Batches, tuple[dict[str, np.ndarray], ...]]:
    """This process's shard of the train split, and its eval batches (`trainer.eval_batches`)."""
    data_seed = cfg.seed + 1  # model init and data order draw from separate streams
    shard = dict(shard_index=jax.process_index(), shard_count=jax.process_count())
    batch_size = cfg.data.batch_size // jax.process_count()
    train = Batches(cfg.data, tokenizer, "train", data_seed, batch_size, **shard)
    eval_split = Batches(cfg.data, tokenizer, "eval", data_seed, batch_size, **shard)
    evals = tuple(eval_split.take(cfg.trainer.eval_batches))
    if not evals:
        raise eval_too_small(cfg.data, eval_split.records)
    return train, evals


def build(cfg: DictConfig, run_dir: str, group: str | None = None, name: str | None = None,
          abstract: bool = False, devices: Sequence[jax.Device] | None = None) -> Experiment:
    """Turn a validated config into an Experiment.

    `abstract`: shape-only model, no loggers. `devices`: lay the mesh out on
    these (e.g. a TPU topology's devices for AOT compilation) instead of the local ones.
    """
    check_targets(cfg, tuple(cfg.allow_targets))  # each `_target_` judged by what it names, before any is built
    devices = devices if devices is not None else check_platform(cfg.hardware)
    mesh, rules = make_mesh(cfg.mesh, devices), logical_rules(cfg.mesh)
    shapes = abstract_model(cfg.model)
    check_layout(mesh, rules, shapes, cfg.model, cfg.data.batch_size)
    algorithm = instantiate(cfg.algorithm, _convert_="all")
    tokenizer = make_tokenizer(cfg.data.tokenizer)
    if tokenizer.vocab_size > cfg.model.vocab_size:
        raise ConfigError(
            f"'model.vocab_size'={cfg.model.vocab_size} is smaller than the tokenizer's vocabulary "
            f"({tokenizer.vocab_size} for data.tokenizer={cfg.data.tokenizer!r}); raise model.vocab_size."
        )
    train, evals = _splits(cfg, tokenizer)
    quant = make_quantization(cfg.quantization, cfg.seed)
    tx, schedule = make_optimizer(cfg.optimizer)
    if not abstract and cfg.hardware.platform == "cpu" and jax.process_count() == 1:  # all of the state is here
        check_host_memory(cfg.model.name, nnx.state(shapes, nnx.Param), tx, quant.trainable is nnx.Param,
                          available_bytes())
    flops = train_flops_per_token(cfg.model, cfg.data.seq_len)
    if abstract:
        model, rewards = _model_and_rewards(cfg, mesh, rules, quant, abstract)
        return Experiment(cfg, run_dir, mesh, rules, model, quant, tx, schedule, algorithm, tokenizer, train, evals,
                          flops, rewards=rewards)
    checkpointer = Checkpointer(cfg, run_dir)
    try:
        meta = resume_meta(checkpointer, run_dir)  # before the model: a refused run costs no model init
        precompiled = start_precompile(Experiment(cfg, run_dir, mesh, rules, None, quant, tx, schedule, algorithm,
                                                  tokenizer, train, evals, flops), lambda: initial_model(cfg, True))
        model, rewards = _model_and_rewards(cfg, mesh, rules, quant, abstract)
        sinks = make_sinks(cfg, run_dir, group, name, (meta or {}).get("wandb_id"))  # a resume continues its wandb run
    except BaseException:
        checkpointer.close()
        raise
    wandb_id = next((s.run_id for s in sinks if hasattr(s, "run_id")), None)
    return Experiment(cfg, run_dir, mesh, rules, model, quant, tx, schedule, algorithm, tokenizer, train, evals,
                      flops, sinks, checkpointer, wandb_id, rewards, precompiled)


def resume_meta(checkpointer: Checkpointer, run_dir: str) -> dict[str, Any] | None:
    """The meta of the step the run resumes from (None: a fresh start). A config the checkpoint
    refuses, or a fresh start on top of a completed run, fails here: nothing is written."""
    meta = checkpointer.latest_meta()
    if meta is None:
        check_not_completed(run_dir)
    return meta


def _model_and_rewards(cfg: DictConfig, mesh: jax.sharding.Mesh, rules: tuple[tuple[str, Any], ...],
                       quant: NoQuantization | Qat | Lora, abstract: bool) -> tuple[nnx.Module, Any]:
    """The policy (quantization applied, params born sharded) and the `reward` group's objects."""
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
        model = quant.apply(initial_model(cfg, abstract), abstract)
    return model, make_rewards(cfg.reward, tuple(cfg.allow_targets))
