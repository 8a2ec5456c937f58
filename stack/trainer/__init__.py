"""The one trainer for every algorithm (see stack/trainer/trainer.py)."""

from stack.summary import Summary
from stack.trainer.trainer import Trainer, default_hooks


def train(exp) -> Summary:
    """Run `exp` to its end (or a stop); the typed summary of the run."""
    return Trainer(exp).run()


__all__ = ["Summary", "Trainer", "default_hooks", "train"]
