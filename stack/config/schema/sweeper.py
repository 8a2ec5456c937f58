"""Schema of `hydra/sweeper=optuna` (the sweeper itself: stack.launch.sweeper)."""

from dataclasses import dataclass


@dataclass
class OptunaSweeperConf:
    """`hydra.sweeper.*` of `hydra/sweeper=optuna`."""

    _target_: str = "hydra_plugins.stack_sweeper.OptunaSweeper"
    n_trials: int = 20
    n_jobs: int = 1  # trials launched at once (through hydra/launcher)
    direction: str = "auto"  # minimize | maximize | auto (maximize accuracies, rewards, margins, scores)
    seed: int = 0  # TPE's seed
    study_name: str = "stack"
