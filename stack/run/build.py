"""Config -> objects. The only caller of `hydra.utils.instantiate` in the project.

Order: hardware -> mesh -> algorithm -> data -> quantization -> optimizer -> checkpoint (the resume point) ->
model -> rewards -> loggers. Every check that needs no model comes before the model is built.
"""

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from stack.checkpoint.manager import Checkpointer
from stack.checkpoint.policy import initial_model
from stack.checkpoint.rundir import check_not_completed
from stack.config.targets import check_targets
from stack.data.pipeline import Batches
from stack.data.tokenizers import Tokenizer, make_tokenizer
from stack.engine.experiment import Experiment
from stack.engine.precompile import start as start_precompile
from stack.errors import ConfigError
from stack.hardware.host_fit import available_bytes, check_host_memory
from stack.hardware.mesh import check_layout, logical_rules, make_mesh
from stack.hardware.platform import check_platform, train_flops_per_token, trained_length
from stack.logging.console import ConsoleSink
from stack.logging.sinks import JsonlSink, Sink
from stack.models.init import abstract_model
from stack.optim.chain import make_optimizer
from stack.quant.providers import Lora, NoQuantization, Qat, make_quantization
from stack.rewards.group import make_env, make_rewards


def make_sinks(cfg: DictConfig, run_dir: str, group: str | None, name: str | None,
               wandb_id: str | None = None) -> tuple[Sink, ...]:
    """The sinks the `logger` list turns on (console, metrics.jsonl, TensorBoard, wandb); process 0's only."""
    if jax.process_index() != 0:
        return ()
    log = cfg.logger
    sinks: list[Sink] = []
    if log.console:
        sinks.append(ConsoleSink(cfg.trainer.steps, progress=log.progress, interval=log.progress_interval))
    if log.jsonl:
        sinks.append(JsonlSink(run_dir))
    if log.tensorboard:
        from stack.logging.tensorboard_sink import TensorBoardSink  # tensorboard's protos: only when logging to it

        sinks.append(TensorBoardSink(run_dir))
    if log.wandb and log.mode != "disabled":
        from stack.logging.wandb_sink import WandbSink  # wandb (~1 s to import): only when logging to it

        config = OmegaConf.to_container(cfg, resolve=True)
        tags = (recipe_name(), cfg.hardware.name)
        sinks.append(WandbSink(log, run_dir, config, group=group, run_id=wandb_id, name=name,
                               job_type=cfg.algorithm.name, tags=tuple(t for t in tags if t)))
    return tuple(sinks)


def recipe_name() -> str | None:
    """The `+recipe=NAME` of the running Hydra job, if any."""
    return HydraConfig.get().runtime.choices.get("recipe") if HydraConfig.initialized() else None


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
        for split in (eval_split, train):  # a malformed record says so (file:line), not that the split is small
            split.check_records()
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
    flops = train_flops_per_token(cfg.model, trained_length(cfg))
    if abstract:
        model, rewards, env = _model_and_rewards(cfg, mesh, rules, quant, abstract)
        return Experiment(cfg, run_dir, mesh, rules, model, quant, tx, schedule, algorithm, tokenizer, train, evals,
                          flops, rewards=rewards, env=env)
    checkpointer = Checkpointer(cfg, run_dir)
    try:
        meta = resume_meta(checkpointer, run_dir)  # before the model: a refused run costs no model init
        precompiled = start_precompile(Experiment(cfg, run_dir, mesh, rules, None, quant, tx, schedule, algorithm,
                                                  tokenizer, train, evals, flops), lambda: initial_model(cfg, True))
        model, rewards, env = _model_and_rewards(cfg, mesh, rules, quant, abstract)
        sinks = make_sinks(cfg, run_dir, group, name, (meta or {}).get("wandb_id"))  # a resume continues its wandb run
    except BaseException:
        checkpointer.close()
        raise
    wandb_id = next((s.run_id for s in sinks if hasattr(s, "run_id")), None)
    return Experiment(cfg, run_dir, mesh, rules, model, quant, tx, schedule, algorithm, tokenizer, train, evals,
                      flops, sinks, checkpointer, wandb_id, rewards, precompiled, env)


def resume_meta(checkpointer: Checkpointer, run_dir: str) -> dict[str, Any] | None:
    """The meta of the step the run resumes from (None: a fresh start). A config the checkpoint
    refuses, or a fresh start on top of a completed run, fails here: nothing is written."""
    meta = checkpointer.latest_meta()
    if meta is None:
        check_not_completed(run_dir)
    return meta


def _model_and_rewards(cfg: DictConfig, mesh: jax.sharding.Mesh, rules: tuple[tuple[str, Any], ...],
                       quant: NoQuantization | Qat | Lora, abstract: bool) -> tuple[nnx.Module, Any, Any]:
    """The policy (quantization applied, params born sharded), the `reward` group's objects and the `env`
    group's (stack.rewards.group)."""
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
        model = quant.apply(initial_model(cfg, abstract), abstract)
    allowed = tuple(cfg.allow_targets)
    return model, make_rewards(cfg.reward, allowed), make_env(cfg.env, allowed)
