"""`warm_start`: a recipe's first stage (e.g. SFT before GRPO), trained in `<run_dir>/warm_start`
when `model.init_from` is not set; the main run then starts from its final checkpoint.

The stage checkpoints like any run, so a rerun of the same command resumes it, or finds it
finished and goes straight on: a newcomer needs one command, and the second run reuses the
first's warm start. The stage uses the main run's model, mesh, hardware and seed.
"""

import copy
import os
from typing import Any

from omegaconf import DictConfig, open_dict

from stack.config.validate import validate
from stack.config.warm_start import has_stage, stage_config
from stack.errors import ConfigError


def warm_start(cfg: DictConfig, run_dir: str, train_run: Any) -> DictConfig:
    """`cfg` starting from the warm-start stage's checkpoint (trained first unless it is done)."""
    if not has_stage(cfg):
        return cfg
    stage = stage_config(cfg, run_dir)
    validate(stage)
    print(f"warm start: +recipe={cfg.warm_start.recipe} in {stage.run_dir} (model.init_from is not set)", flush=True)
    summary = train_run(stage)
    if summary.status != "completed":
        raise ConfigError(f"the warm start in {stage.run_dir} stopped ({summary.status}: {summary.message}); "
                          "rerun the same command to resume it.")
    main = copy.deepcopy(cfg)
    with open_dict(main):
        main.model.init_from = os.path.join(stage.run_dir, "checkpoints")
    return main
