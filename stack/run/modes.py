"""Dispatch by `mode`: train (build, trainer, run dir, summary line), validate, compile."""

import math
import os
import signal
import sys
from contextlib import nullcontext
from typing import Any

import jax
from flax import nnx
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from stack.checkpoint.job_status import write_status
from stack.checkpoint.rundir import owned
from stack.config.schema import objective_of
from stack.engine.aot import compile_report, target_devices
from stack.engine.summary import Summary
from stack.engine.trainer import train
from stack.errors import ConfigError, RunFailed
from stack.hardware.compile_cache import disable_compilation_cache, enable_compilation_cache
from stack.hardware.cpu_compiler import configure_cpu_compiler
from stack.hardware.cpu_dispatch import configure_cpu_dispatch
from stack.launch.children import Stopped, sweep_main
from stack.launch.local import init_distributed
from stack.launch.report import sweep_group
from stack.launch.worker_cores import worker_cores
from stack.logging.library_log import library_log
from stack.run.build import build
from stack.run.warm_start import warm_start


def _hydra_context() -> tuple[str | None, str | None, str | None]:
    """(output dir, sweep group, job name) when running under Hydra, else Nones."""
    if not HydraConfig.initialized():
        return None, None, None
    hc = HydraConfig.get()
    multirun = OmegaConf.select(hc, "job.num") is not None and hc.mode.name == "MULTIRUN"
    group = sweep_group(hc.sweep.dir) if multirun else None
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


def describe(s: Summary, objective: str) -> str:
    """The one-line account of a finished run: its objective from the first eval to the last."""
    value, start = s.metric(objective), s.eval_at_start.get(objective)
    if s.first_step > s.final_step:  # resumed at (or past) trainer.steps
        return (f"done: nothing to train, the checkpoint is at step {s.final_step} (raise trainer.steps to go on) | "
                f"{objective} {value if value is None else f'{value:.4f}'} | {s.run_dir}")
    resumed = f" (resumed after step {s.first_step - 1})" if s.first_step > 1 else ""
    perf = s.perf
    change = f"{start:.4f} -> " if start is not None else ""
    rate = (f"{perf['perf/tokens_per_sec']:,.0f} tok/s, MFU {perf.get('perf/mfu', 0.0):.1%}" if "perf/tokens_per_sec"
            in perf else "no tok/s (its one step compiled)")
    return (f"done: {s.final_step} steps{resumed} in {perf.get('seconds', 0.0):.1f}s "
            f"(compile {perf.get('compile_seconds', 0.0):.2f}s) | "
            f"train/loss {s.train.get('train/loss', math.nan):.4f} | "
            f"{objective} {change}{value if value is None else f'{value:.4f}'} | {rate} | {s.run_dir}")


def train_run(cfg: DictConfig) -> Summary:
    """`mode=train`: own the run dir (stack.checkpoint.rundir), library records into its run.log, then the
    warm-start stage if any, write the resolved config to the run dir, build, train; the Summary."""
    output_dir, group, name = _hydra_context()
    run_dir = cfg.run_dir or output_dir
    if not run_dir:
        raise ConfigError("'run_dir' is not set and no Hydra output dir exists; set run_dir=PATH.")
    with owned(run_dir) if jax.process_index() == 0 else nullcontext():  # one owner: process 0
        with library_log(run_dir, jax.process_index()):  # Orbax's, Grain's, jax's records: not on the console
            return _train_in(warm_start(cfg, run_dir, train_run), run_dir, group, name)


def _train_in(cfg: DictConfig, run_dir: str, group: str | None, name: str | None) -> Summary:
    exp = build(cfg, run_dir, group=group, name=name)  # refuses a run that cannot resume there: nothing written yet
    if jax.process_index() == 0:
        with open(os.path.join(run_dir, "config.yaml"), "w") as f:
            f.write(OmegaConf.to_yaml(cfg, resolve=True))
    summary = None
    try:
        summary = train(exp)
    finally:
        exp.checkpointer.close()  # the last async save completes before the process ends
        for workers in (exp.rewards, exp.env):  # reward and environment worker processes
            if workers is not None:
                workers.close()
        for sink in exp.sinks:
            sink.close(summary.metrics() if summary else None)
    return summary


def compile_for_target(cfg: DictConfig) -> int:
    """`mode=compile`: the experiment built shape-only on the target's devices (TPU topologies from
    libtpu, GPUs from the CUDA plugin), its programs compiled and reported (stack.engine.aot)."""
    return compile_report(build(cfg, run_dir="", abstract=True, devices=target_devices(cfg.hardware)))


def prepare(cfg: DictConfig) -> None:
    """Before the first computation: CPU dispatch and compiler flags (read once), the other processes
    of a multi-process run joined, the persistent compilation cache (none for another platform's compile)."""
    configure_cpu_dispatch(cfg)  # before the first computation: jax reads it when the CPU backend starts
    configure_cpu_compiler(cfg)  # before the first compile: XLA reads its flags once
    init_distributed()  # a launcher=local rank: join the other processes before any computation
    if cfg.mode == "compile" and cfg.hardware.platform != "cpu":
        disable_compilation_cache()
    else:
        enable_compilation_cache(cfg.trainer.compilation_cache)


def run(cfg: DictConfig) -> Any:
    """Run `cfg` per its `mode`; for training return the objective (`trainer.objective`)."""
    if cfg.mode == "validate":
        return check(cfg)
    prepare(cfg)
    if cfg.mode == "compile":
        return compile_for_target(cfg)  # 0: fits, 1: does not fit
    summary = train_run(cfg)
    if summary.status == "preempted":
        print(f"{summary.message}: checkpoint saved; rerun the same command to resume.", flush=True)
        if summary.signal == signal.SIGINT or sweep_main():  # Ctrl-C: saved like SIGTERM, then exit 130;
            raise Stopped(summary.signal or signal.SIGTERM)  # a sweep's main process: no later job starts
    name = objective_of(cfg)
    objective = summary.metric(name)
    if objective is None and summary.status == "completed":
        raise ConfigError(f"The objective {name!r} (sweep.objective / trainer.objective) is not a metric of the run; "
                          f"available: {', '.join(sorted(summary.metrics()))}.")
    if jax.process_index() == 0:  # for sweep reports and a sweep's exit code (stack.launch.report)
        write_status(summary.run_dir, summary.status, objective=name, value=objective, step=summary.final_step,
                     seconds=summary.perf.get("seconds"), message=summary.message, devices=jax.device_count(),
                     cores=worker_cores())
    if summary.status == "stopped_nonfinite":  # its paragraph alone: a `done:` line before it named another step
        raise RunFailed(f"{summary.message} The run stopped after step {summary.final_step}.")
    print(describe(summary, name), file=sys.stdout)
    return objective
