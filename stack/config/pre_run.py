"""The check `python -m stack` runs before a run dir or its lock exists: every `_target_` and
reward function path the run would import (stack.config.targets), its warm-start stage's included."""

from omegaconf import DictConfig

from stack.config.schema.reward import RewardConfig
from stack.config.targets import check_reward_function, check_targets, resolve
from stack.config.validate import validate
from stack.config.warm_start import has_stage, stage_config
from stack.errors import ConfigError, short


def check_before_run(cfg: DictConfig) -> None:
    """Both steps for every `_target_` and reward function path of `cfg` and of its warm-start stage
    (importing what they name): a refused one stops the run before its run dir or lock exists."""
    if has_stage(cfg):
        try:
            stage = stage_config(cfg)
            validate(stage)
            check_before_run(stage)
        except ConfigError as exc:
            raise ConfigError(f"The warm-start stage (warm_start.recipe={cfg.warm_start.recipe}): {exc}") from None
    allowed = tuple(cfg.allow_targets)
    check_targets(cfg, allowed)
    for name in cfg.reward.get("functions") or ():
        check_reward_function(name, allowed)
        if name in RewardConfig.rules:
            continue
        try:
            resolve(str(name), tuple(p.rstrip(".") for p in allowed))
        except (LookupError, ImportError) as why:
            raise ConfigError(f"'reward.functions' entry {short(name)!r} cannot be used: {why}.") from None
