"""Checks of the `eval` keys: sampled evaluation (pass@k, maj@k) of the algorithms whose eval generates."""

from typing import Any

from omegaconf import DictConfig, OmegaConf

from stack.errors import ConfigError


def check_eval(cfg: DictConfig) -> None:
    """`eval.num_samples` null or >= 0 for GRPO / PPO, `eval.temperature` null or > 0, and
    `eval.correct` (default `accuracy`) one of `reward.functions` when samples or it are asked for."""
    e = cfg.eval
    samples, correct = e.num_samples, e.correct
    if samples is not None and (not isinstance(samples, int) or samples < 0):
        raise ConfigError(f"'eval.num_samples'={samples!r}: the sampled completions per eval prompt beside the greedy "
                          "one (pass@k, maj@k for k up to it): null or 0 (greedy only) or a positive integer.")
    if samples and not OmegaConf.get_type(cfg.algorithm).samples_at_eval:
        raise ConfigError(f"'eval.num_samples'={samples} samples completions at eval; algorithm="
                          f"{cfg.algorithm.name!r} evaluates its loss on held-out records and generates nothing. "
                          "It applies to algorithm=grpo and algorithm=ppo; drop the key (or set it to null).")
    if e.temperature is not None and not e.temperature > 0:
        raise ConfigError(f"'eval.temperature'={e.temperature} must be > 0 (null: algorithm.temperature); the "
                          "greedy completion is always there beside the samples.")
    if samples or correct is not None:
        _check_correct(cfg, correct or "accuracy", samples)


def _check_correct(cfg: DictConfig, correct: str, samples: Any) -> None:
    functions = list(cfg.reward.functions)
    if correct not in functions:
        asked = f"'eval.num_samples'={samples} scores samples by" if samples else "'eval.correct' names"
        raise ConfigError(f"{asked} the reward function {correct!r} (eval.correct; >= 1: a right answer), which "
                          f"reward.functions={functions} lacks. Add it to reward.functions (with weight 0 in "
                          "reward.weights it leaves the reward alone) or set eval.correct to one of them.")
