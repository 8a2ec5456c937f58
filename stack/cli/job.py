"""One Hydra job of `python -m stack`: validate, then run it (stack.run.modes) in this process.

A plain run's bad input or failure is one paragraph and exit 2 (1 for a failure during work). In a
sweep a failing job is recorded (`status.json`, or `refused.json` when its run dir is another
run's) and the sweep goes on; its reason is the same one paragraph (the traceback for anything
else, or with `HYDRA_FULL_ERROR=1`).
"""

import os
import sys
import traceback
import warnings
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from stack.checkpoint.job_status import FILE, REFUSED, write_status
from stack.config.hf_config import take_architecture
from stack.config.jax_env import set_jax_env
from stack.config.validate import validate
from stack.errors import ConfigError, RunDirRefused, RunFailed, paragraph, short
from stack.hardware.gc_freeze import frozen_imports
from stack.launch.children import sweep_stopped
from stack.launch.worker_cores import process_workers, tune_host


def _run(cfg: DictConfig) -> Any:
    take_architecture(cfg, list(HydraConfig.get().overrides.task))
    validate(cfg)
    set_jax_env(cfg)
    if cfg.hardware.platform == "cpu":
        _tune_host()
    with frozen_imports("stack.run.modes"):  # jax is imported only here, after validation (stack.hardware.gc_freeze)
        from stack.run.modes import run

    return run(cfg)


def _tune_host() -> None:
    """Before jax starts its threads on a CPU run: a parallel sweep's worker takes its share of the
    cores and malloc keeps freed pages (stack.launch.worker_cores.tune_host)."""
    hc = HydraConfig.get()
    n_jobs = process_workers(hc.launcher) if hc.mode == RunMode.MULTIRUN else None
    tune_host(hc.sweep.dir if n_jobs else "", n_jobs)


def _ours(exc: BaseException) -> bool:
    """Whether `exc` is told as one paragraph (stack's own errors, unless HYDRA_FULL_ERROR=1)."""
    return isinstance(exc, (ConfigError, RunFailed)) and os.environ.get("HYDRA_FULL_ERROR") != "1"


def task(cfg: DictConfig) -> Any:
    """One Hydra job. In a multirun a failing job is recorded and the sweep goes on."""
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    if multirun and sweep_stopped():  # Ctrl-C ended the sweep while this worker finished its last job
        print(f"the sweep was interrupted: job not started ({HydraConfig.get().runtime.output_dir})", file=sys.stderr)
        return None
    try:
        result = _run(cfg)
        if cfg.mode == "compile" and result and not multirun:
            sys.exit(result)  # mode=compile: exit 1 when the step does not fit the chip
        return result
    except Exception as exc:
        if not multirun:
            if _ours(exc):
                print(paragraph(exc), file=sys.stderr)
                # the paragraph stays the last word: a failed async save (Orbax) can leave a write
                # coroutine that Python reports as never awaited when it collects it at exit
                warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
                sys.exit(2 if isinstance(exc, ConfigError) else 1)
            raise
        _sweep_job_failed(cfg, exc)
        return None


def _sweep_job_failed(cfg: DictConfig, exc: Exception) -> None:
    """Record a sweep job's failure for the report and say why: one paragraph or the traceback."""
    job = cfg.get("run_dir") or HydraConfig.get().runtime.output_dir
    if os.environ.get("STACK_PROCESS_ID", "0") == "0":  # read back by stack.launch.report at the sweep's end
        refused = isinstance(exc, RunDirRefused)  # the dir's own run keeps its status.json
        write_status(job, "refused" if refused else "failed", file=REFUSED if refused else FILE,
                     error=f"{type(exc).__name__}: {short(str(exc), 2000)}")
    if _ours(exc):
        print(paragraph(exc), file=sys.stderr)
    else:
        traceback.print_exc()
    print(f"job failed, the sweep goes on: {job}", file=sys.stderr)


hydra_task = hydra.main(version_base=None, config_path="pkg://stack.conf", config_name="config")(task)
