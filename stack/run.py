"""Dispatch by `mode`: train (build, loop, run dir, summary line), validate, compile."""

import math
import os
import sys
from typing import Any

import jax
from flax import nnx
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from stack.build import build
from stack.errors import ConfigError
from stack.loop import train


def _hydra_context() -> tuple[str | None, str | None, str | None]:
    """(output dir, sweep group, job name) when running under Hydra, else Nones."""
    if not HydraConfig.initialized():
        return None, None, None
    hc = HydraConfig.get()
    multirun = OmegaConf.select(hc, "job.num") is not None and hc.mode.name == "MULTIRUN"
    group = hc.sweep.dir.replace("/", "_").strip("_") if multirun else None
    name = hc.job.override_dirname or None if multirun else None
    return hc.runtime.output_dir, group, name


def check(cfg: DictConfig) -> None:
    """`mode=validate`: build everything (the model shape-only), print what would run."""
    exp = build(cfg, run_dir="", abstract=True)
    params = nnx.state(exp.model, nnx.Param)
    n = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    tokens = exp.algorithm.batch_tokens(exp.eval_batches[0]) * cfg.trainer.grad_accum
    print(f"config OK: {cfg.model.name} with {n:,} params, algorithm {cfg.algorithm.name}, "
          f"{tokens:,} tokens per optimizer step, {cfg.trainer.steps} steps on {cfg.hardware.name}")


def run(cfg: DictConfig) -> Any:
    """Run `cfg` per its `mode`; for training return the objective (`trainer.objective`)."""
    if cfg.mode == "validate":
        return check(cfg)
    if cfg.mode == "compile":
        from stack.compile import compile_for_target  # jax[tpu] (libtpu) is needed only here

        return compile_for_target(cfg)  # 0: fits, 1: does not fit
    output_dir, group, name = _hydra_context()
    run_dir = cfg.run_dir or output_dir
    if not run_dir:
        raise ConfigError("'run_dir' is not set and no Hydra output dir exists; set run_dir=PATH.")
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.yaml"), "w") as f:
        f.write(OmegaConf.to_yaml(cfg, resolve=True))
    exp = build(cfg, run_dir, group=group, name=name)
    summary = None
    try:
        summary = train(exp)
    finally:
        exp.checkpointer.close()  # the last async save completes before the process ends
        for sink in exp.sinks:
            sink.close(summary)
    if summary["preempted"]:
        print(f"preempted by signal {int(summary['preempted'])} after step {summary['steps']}: checkpoint "
              "saved; rerun the same command to resume.", flush=True)
    objective = summary.get(cfg.trainer.objective)
    resumed = f" (resumed after step {summary['first_step'] - 1})" if summary["first_step"] > 1 else ""
    if objective is None:
        raise ConfigError(
            f"'trainer.objective'={cfg.trainer.objective!r} is not a summary metric; "
            f"available: {', '.join(sorted(summary))}."
        )
    print(
        f"done: {summary['steps']} steps{resumed} in {summary['seconds']:.1f}s "
        f"(compile {summary['compile_seconds']:.1f}s) | train/loss {summary.get('train/loss', float('nan')):.4f} | "
        f"eval/loss {summary['eval/loss_at_start']:.4f} -> {summary['eval/loss']:.4f} | "
        f"{summary['perf/tokens_per_sec']:,.0f} tok/s, MFU {summary['perf/mfu']:.1%} | {cfg.trainer.objective} {objective:.4f} | {run_dir}",
        file=sys.stdout,
    )
    return objective
