"""Shipped as the package `hydra_plugins.stack_sweeper` (pyproject package-dir), where Hydra's
plugin discovery looks; `stack.config.schema` also registers it by hand for editable installs, whose
import hook Hydra's package scan does not see. The logic is in stack/launch/sweeper.py."""

import os
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper


class OptunaSweeper(Sweeper):
    """`hydra/sweeper=optuna` (stack.config.schema.sweeper.OptunaSweeperConf)."""

    def __init__(self, n_trials: int, n_jobs: int, direction: str, seed: int, study_name: str):
        self.n_trials, self.n_jobs, self.direction = n_trials, n_jobs, direction
        self.seed, self.study_name = seed, study_name
        self.config = self.launcher = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        from omegaconf import OmegaConf  # Hydra imports every plugin at start-up: the sweep's code loads here

        from stack.config.schema import objective_of
        from stack.errors import ConfigError, exit_on
        from stack.launch.sweeper import open_study, run_trials, search_space, study_direction

        sweep_dir = str(self.config.hydra.sweep.dir)
        with exit_on(ConfigError):  # one paragraph, exit 2 (Hydra would print the traceback)
            space, fixed = search_space(arguments)
            study = open_study(sweep_dir, self.study_name, study_direction(self.direction, objective_of(self.config)),
                               self.seed)
        OmegaConf.save(self.config, os.path.join(sweep_dir, "multirun.yaml"))
        run_trials(study, space, fixed, self.launcher.launch, self.n_trials, self.n_jobs)
        return study
