"""`warm_start`: a recipe's first stage (e.g. SFT before GRPO), trained in `<run_dir>/warm_start`
when `model.init_from` is not set; the main run then starts from its final checkpoint.

The stage checkpoints like any run, so a rerun of the same command resumes it, or finds it
finished and goes straight on: a newcomer needs one command, and the second run reuses the
first's warm start. The stage uses the main run's model, mesh, hardware and seed.
"""

import copy
import os
from typing import Any

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict

from stack.config.schema import CONFIG_MODULE
from stack.config.validate import validate
from stack.errors import ConfigError


def stage_config(cfg: DictConfig, run_dir: str) -> DictConfig:
    """The warm-start stage's config: its recipe, the main run's model/mesh/hardware/seed."""
    overrides = [f"+recipe={cfg.warm_start.recipe}", *cfg.warm_start.overrides,
                 f"run_dir={os.path.join(run_dir, 'warm_start')}", "checkpoint=local", "logger=jsonl"]
    try:
        if GlobalHydra.instance().is_initialized():
            stage = compose(config_name="config", overrides=overrides)
        else:
            with initialize_config_module(CONFIG_MODULE, version_base=None):
                stage = compose(config_name="config", overrides=overrides)
    except Exception as exc:
        raise ConfigError(f"'warm_start'={OmegaConf.to_container(cfg.warm_start)} cannot be composed: "
                          f"{str(exc).splitlines()[0]}") from exc
    with open_dict(stage):
        for key in ("mesh", "hardware", "seed"):
            stage[key] = cfg[key]
        stage.model = OmegaConf.merge(cfg.model, {"init_from": None})
    return stage


def warm_start(cfg: DictConfig, run_dir: str, train_run: Any) -> DictConfig:
    """`cfg` starting from the warm-start stage's checkpoint (trained first unless it is done)."""
    if not cfg.warm_start.recipe or cfg.model.init_from:
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
