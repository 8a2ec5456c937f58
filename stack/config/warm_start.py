"""The config of a recipe's warm-start stage (`warm_start.recipe`, e.g. SFT before GRPO): its recipe
and overrides, composed with the main run's model, mesh, hardware and seed (stack.run.warm_start
trains it). Composed before the run too, so its targets are checked before anything exists."""

import os

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict

from stack.config.schema import CONFIG_MODULE
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


def has_stage(cfg: DictConfig) -> bool:
    """Whether `cfg` trains a warm-start stage first (a recipe named and no `model.init_from`)."""
    return bool(cfg.warm_start.recipe) and not cfg.model.init_from
