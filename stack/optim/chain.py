"""The `optimizer` group as an Optax chain: the YAML list of transforms, built in order."""

from typing import Any

import optax
from hydra.utils import instantiate

from stack.errors import ConfigError


def make_optimizer(cfg: Any) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The Optax chain from its YAML list, and the learning-rate schedule (for logging)."""
    schedule = instantiate(cfg.schedule) if cfg.schedule is not None else optax.constant_schedule(cfg.lr)
    transforms = []
    for i, node in enumerate(cfg.chain):
        try:
            transforms.append(instantiate(node, _convert_="all"))
        except Exception as exc:
            cause = exc.__cause__ or exc
            raise ConfigError(
                f"'optimizer.chain.{i}' ({node.get('_target_')}) cannot be built: {cause}. "
                "Check its keys against the Optax function's arguments."
            ) from exc
    if not transforms:
        raise ConfigError("'optimizer.chain' is empty: list at least one Optax transform.")
    return optax.chain(*transforms), schedule
