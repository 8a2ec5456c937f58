"""Checks of the `env` group: an environment GRPO can run (a built-in or an allowed import path) and its sizes."""

from omegaconf import DictConfig, OmegaConf

from stack.config.schema.algorithm import GRPOConfig
from stack.config.schema.env import EnvConfig
from stack.errors import ConfigError, bad_choice


def check_env(cfg: DictConfig) -> None:
    """`env.environment` null, or one GRPO rolls out with (not with sampled eval: its rows are greedy)."""
    e = cfg.env
    if e.environment is None:
        return
    name = e.environment
    if "." not in name and name not in EnvConfig.builtins:
        raise bad_choice("env.environment", name, EnvConfig.builtins, what="environment")
    allowed = tuple(p.rstrip(".") + "." for p in cfg.allow_targets)
    if "." in name and not name.startswith(allowed):
        raise ConfigError(f"'env.environment'={name!r} is not a built-in environment ({', '.join(EnvConfig.builtins)})"
                          f" and its module is not allowed; to run it on purpose add "
                          f"'allow_targets=[{name.rsplit('.', 1)[0]}]'.")
    if OmegaConf.get_type(cfg.algorithm) is not GRPOConfig:
        raise ConfigError(f"'env.environment'={name!r} rolls out multi-turn trajectories for algorithm=grpo; "
                          f"algorithm={cfg.algorithm.name!r} does not. Use algorithm=grpo, or env=none.")
    if e.max_turns is not None and (not isinstance(e.max_turns, int) or e.max_turns < 1):
        raise ConfigError(f"'env.max_turns'={e.max_turns!r} must be a positive integer (model turns per trajectory).")
    if e.timeout is not None and not e.timeout > 0:
        raise ConfigError(f"'env.timeout'={e.timeout} must be > 0 (seconds per batch of resets or steps).")
    if cfg.eval.num_samples:
        raise ConfigError(f"'eval.num_samples'={cfg.eval.num_samples}: sampled evaluation is of single-turn "
                          f"rollouts, and env.environment={name!r} rolls out multi-turn ones (evaluated greedily). "
                          "Drop eval.num_samples, or use env=none.")
