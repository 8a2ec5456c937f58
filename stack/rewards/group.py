"""The `reward` group: rule functions by name (or a user's function by import path) run by a
RewardRunner in worker processes with a timeout, or a trained reward model (`reward=model`); and the
`env` group's environments (an EnvRunner), which reward trajectories beside them."""

import functools
from typing import Any, Callable

from stack.config import targets
from stack.config.schema.env import EnvConfig
from stack.config.targets import check_reward_function
from stack.errors import ConfigError
from stack.rewards.calculator import Calculator
from stack.rewards.env_runner import EnvRunner
from stack.rewards.functions import RULES
from stack.rewards.model import ModelReward
from stack.rewards.runner import RewardRunner

ENVIRONMENTS = {"calculator": Calculator}  # the built-in environments (stack.config.schema.env.EnvConfig.builtins)


def resolve(name: str, allowed: tuple[str, ...]) -> Callable:
    """A built-in rule by name, or `pkg.module.fn` by import path when `allow_targets` lists its package."""
    check_reward_function(name, allowed)
    if name in RULES:
        return RULES[name]
    try:
        return targets.resolve(name, tuple(p.rstrip(".") for p in allowed))
    except (LookupError, ImportError) as why:
        raise ConfigError(f"'reward.functions' entry {name!r} cannot be used: {why}.") from None


def make_rewards(cfg: Any, allowed: tuple[str, ...]) -> Any:
    """The runner of the `reward` group's rule functions, or its reward model (`init_from`: a
    stack.rewards.model.ModelReward holding the runner of any functions listed beside it, the
    last weight its own)."""
    options = {"format": {"pattern": cfg.format_pattern}, "length": {"max_length": cfg.max_length}}
    functions = [(metric_name(name, list(cfg.functions)), functools.partial(resolve(name, allowed),
                                                                            **options.get(name, {})))
                 for name in cfg.functions]
    weights = list(cfg.weights) if cfg.weights is not None else [1.0] * (len(functions) + (cfg.init_from is not None))
    runner = RewardRunner(functions, weights[:len(functions)], cfg.timeout) if functions else None
    if cfg.init_from is None:
        return runner
    return ModelReward(cfg.init_from, rules=runner, weight=weights[-1])


def metric_name(name: str, names: list[str]) -> str:
    """A function's name in its metrics (`rewards/<name>/mean`): the function's own name, as TRL
    logs it, or its whole import path when another listed function has the same name."""
    short = name.rsplit(".", 1)[-1]
    return short if sum(n.rsplit(".", 1)[-1] == short for n in names) == 1 else name



def make_env(cfg: Any, allowed: tuple[str, ...]) -> EnvRunner | None:
    """The `env` group's EnvRunner (None: single-turn rollouts): a built-in environment by name, or a
    class by import path when `allow_targets` lists its package."""
    if cfg.environment is None:
        return None
    factory = ENVIRONMENTS.get(cfg.environment)
    if factory is None:
        try:
            factory = targets.resolve(cfg.environment, tuple(p.rstrip(".") for p in allowed))
        except (LookupError, ImportError) as why:
            raise ConfigError(f"'env.environment'={cfg.environment!r} cannot be used: {why}.") from None
    sizes = {k: default if cfg[k] is None else cfg[k] for k, default in EnvConfig.defaults.items()}
    return EnvRunner(cfg.environment, factory, **sizes)
