"""A plain run (no -m, --cfg, --help, --info) as the one Hydra job `@hydra.main` starts for it, from
the config the preflight composed: Hydra 1.3's `Hydra.run` (callbacks, then `run_job`: the run dir,
HydraConfig, logging, `.hydra/`), without the two compositions of the same config `@hydra.main`
adds (`Hydra.get_mode`, then `Hydra.run`'s own; ~0.12 s each of a tiny run's ~4.5 s).

Needs GlobalHydra initialized (`initialize_config_module`) around both calls.
"""

import copy
from collections.abc import Callable
from typing import Any

from hydra._internal.callbacks import Callbacks
from hydra._internal.utils import run_and_report
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import run_job
from hydra.types import HydraContext, RunMode
from omegaconf import DictConfig, open_dict, read_write

from stack.checkpoint.rundir import creatable, unclaimed

CONFIG_NAME = "config"


def compose_run(overrides: list[str]) -> DictConfig:
    """The run's whole config (its `hydra` node included), composed as `Hydra.run` composes it: from
    the shell, mode RUN (`_run_app` adds `hydra.mode=RUN` when the config sets no mode)."""
    hydra = GlobalHydra.instance().hydra
    return hydra.compose_config(CONFIG_NAME, [*overrides, "hydra.mode=RUN"], run_mode=RunMode.RUN,
                                with_log_configuration=True)


def sets_job_dir(override: str) -> bool:
    """Whether a command-line override sets Hydra's job dir or its `.hydra/` subdir."""
    return override.lstrip("+~").startswith(("hydra.run.dir", "hydra.output_subdir"))


def into_run_dir(cfg: DictConfig, job: DictConfig, overrides: list[str]) -> None:
    """A run given `run_dir=PATH` (and no `hydra.run.dir`/`hydra.output_subdir` of its own), in any
    mode: Hydra's job dir is PATH too, and Hydra writes nothing there: no `.hydra/` (training writes
    its config.yaml) and no `app.log` (its warnings are on the console), so nothing goes to
    `outputs/`, a training run refused there (stack.checkpoint.rundir) writes nothing, and the ranks of
    launcher=local, any mode, share PATH without a log file. PATH is checked here, before Hydra makes
    it (`run_dir` named in the error). Without either, Hydra's default dir is claimed (`unclaimed`)."""
    if any(sets_job_dir(o) for o in overrides):
        return
    if not job.run_dir:  # Hydra's default outputs/DATE/H-M-S: a dir of its own, `-N` added when taken
        with read_write(cfg.hydra):
            cfg.hydra.run.dir = unclaimed(str(cfg.hydra.run.dir), "hydra.run.dir")
        return
    creatable(job.run_dir, "run_dir")
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.run.dir, cfg.hydra.output_subdir = job.run_dir, None
        log = cfg.hydra.job_logging
        if log and "file" in (log.get("handlers") or {}):  # its app.log (warnings, on the console too)
            del log.handlers["file"]
            log.root.handlers = [h for h in log.root.get("handlers", []) if h != "file"]


def job_part(cfg: DictConfig) -> DictConfig:
    """A copy of `cfg` without its `hydra` node: what the job function receives."""
    job = copy.deepcopy(cfg)
    with open_dict(job):
        del job["hydra"]
    return job


def run(cfg: DictConfig, task: Callable[[DictConfig], Any]) -> Any:
    """`task`'s return value, run as the one job of `cfg` (from `compose_run`); an exception it
    raises is reported as Hydra reports it (the traceback, exit code 1)."""
    def job() -> Any:
        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=CONFIG_NAME)
        context = HydraContext(config_loader=GlobalHydra.instance().hydra.config_loader, callbacks=callbacks)
        ret = run_job(hydra_context=context, task_function=task, config=cfg, job_dir_key="hydra.run.dir",
                      job_subdir_key=None)
        callbacks.on_run_end(config=cfg, config_name=CONFIG_NAME, job_return=ret)
        return ret.return_value  # raises the job's exception

    return run_and_report(job)
