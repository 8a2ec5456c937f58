"""The one trainer for every algorithm (see stack/engine/trainer/trainer.py)."""

from stack.engine.experiment import Experiment
from stack.engine.summary import Summary
from stack.engine.trainer.trainer import Trainer, default_hooks


def train(exp: Experiment) -> Summary:
    """Run `exp` to its end (or a stop); the typed summary of the run."""
    return Trainer(exp).run()


__all__ = ["Summary", "Trainer", "default_hooks", "train"]
