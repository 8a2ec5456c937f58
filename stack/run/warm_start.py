"""`warm_start`: a recipe's first stage (e.g. SFT before GRPO), trained when `model.init_from` is
not set; the main run then starts from its final checkpoint.

Warm starts are shared: a stage lives in `<warm_start.dir or cache root/warm_starts>/<key>`, the key
a digest of its resolved config (stack.config.warm_start.stage_key), so every run asking for the
same stage (GRPO's and PPO's 800-step SFT, a rerun, a sweep's jobs) trains it once and reuses it.
The stage checkpoints like any run: an interrupted one resumes; a run that finds another training
it waits. A run dir made before warm starts were shared keeps its own `<run_dir>/warm_start`.
"""

import copy
import os
import time
from typing import Any

from omegaconf import DictConfig, open_dict

from stack.checkpoint.job_status import read_status, write_status
from stack.config.validate import validate
from stack.config.warm_start import has_stage, stage_config, stage_key
from stack.errors import ConfigError, RunDirInUse
from stack.hardware.compile_cache import cache_root

WAIT_SECONDS = 5.0  # between looks at a warm start another run is training


def stage_dir(cfg: DictConfig, stage: DictConfig, run_dir: str) -> str:
    """Where the stage of `cfg` lives: the run dir's own `warm_start/` when it has one (made before
    warm starts were shared), else the shared dir of the stage's key."""
    own = os.path.join(run_dir, "warm_start")
    if os.path.isdir(own):
        return own
    return os.path.join(cfg.warm_start.dir or os.path.join(cache_root(), "warm_starts"), stage_key(stage))


def warm_start(cfg: DictConfig, run_dir: str, train_run: Any) -> DictConfig:
    """`cfg` starting from its warm-start stage's checkpoint, trained first unless it is done."""
    if not has_stage(cfg):
        return cfg
    stage = stage_config(cfg)
    with open_dict(stage):
        stage.run_dir = stage_dir(cfg, stage, run_dir)
    validate(stage)
    if (read_status(stage.run_dir) or {}).get("status") == "completed":
        print(f"warm start: reusing +recipe={cfg.warm_start.recipe} from {stage.run_dir} (trained earlier)", flush=True)
    else:
        print(f"warm start: +recipe={cfg.warm_start.recipe} in {stage.run_dir} (model.init_from is not set)",
              flush=True)
        began = time.monotonic()
        _train_stage(stage, train_run)
        print(f"warm start: done in {time.monotonic() - began:.0f} s ({stage.run_dir}); the run starts from it",
              flush=True)
    main = copy.deepcopy(cfg)
    with open_dict(main):
        main.model.init_from = os.path.join(stage.run_dir, "checkpoints")
    return main


def _train_stage(stage: DictConfig, train_run: Any) -> None:
    """Train the stage to its end; while another run holds its dir, wait for that run (then the
    stage is done, or resumes from where that run stopped)."""
    waiting = False
    while True:
        if waiting and (read_status(stage.run_dir) or {}).get("status") == "completed":
            return  # the other run finished it
        try:
            summary = train_run(stage)
            break
        except RunDirInUse:
            if not waiting:
                print(f"warm start: another run is training it in {stage.run_dir}; waiting", flush=True)
                waiting = True
            time.sleep(WAIT_SECONDS)
    if summary.status != "completed":
        raise ConfigError(f"the warm start in {stage.run_dir} stopped ({summary.status}: {summary.message}); "
                          "rerun the same command to resume it.")
    write_status(stage.run_dir, "completed", step=summary.final_step)  # what the next run asking for it reads
