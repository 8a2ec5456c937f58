"""Checks of the `rollout` keys: which engine GRPO and PPO generate with (stack.rollout) and its sizes;
and of the `env` group (stack.config.env)."""

from omegaconf import DictConfig, OmegaConf

from stack.config.env import check_env
from stack.errors import ConfigError, bad_choice

ENGINES = ("static", "paged")
SIZES = ("slots", "page_size", "pages")


def check_rollout(cfg: DictConfig) -> None:
    """`rollout.engine` null, static or paged (for an algorithm that generates); the paged engine's
    sizes null or positive integers, and set only for it; the `env` group."""
    check_env(cfg)
    r = cfg.rollout
    if r.engine is not None and r.engine not in ENGINES:
        raise bad_choice("rollout.engine", r.engine, ENGINES)
    for key in SIZES:
        value = r[key]
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"'rollout.{key}'={value!r} must be null (the default) or a positive integer.")
        if value is not None and r.engine != "paged":
            raise ConfigError(f"'rollout.{key}'={value} sizes the paged engine, and rollout.engine="
                              f"{r.engine or 'static'!r}. Set rollout.engine=paged, or drop the key.")
    if r.pages is not None and r.pages < 2:
        raise ConfigError(f"'rollout.pages'={r.pages}: the pool holds a scratch page and at least one request's "
                          "pages; null sizes it for every slot's longest request.")
    if r.engine == "paged" and not OmegaConf.get_type(cfg.algorithm).samples_at_eval:
        raise ConfigError(f"'rollout.engine'=paged generates completions; algorithm={cfg.algorithm.name!r} "
                          "generates nothing. It applies to algorithm=grpo and algorithm=ppo; drop the key.")
