"""`hydra/sweeper=optuna`: a Bayesian sweep over Optuna's ask/tell (TPE, seeded), written for the
current Optuna (the stock Hydra plugin pins optuna<3). The class Hydra instantiates is
`hydra_plugins.stack_sweeper.OptunaSweeper` (stack/launch/hydra_plugin); the work is here.

- Search space in Hydra's sweep syntax: `interval(a,b)` (float), `range(a,b[,step])` (int,
  or float with a float step), `choice(...)` / `a,b,c` (categorical), `tag(log, ...)` for a log
  scale; other overrides are passed to every trial unchanged.
- Each batch of `n_jobs` trials goes through the configured launcher (joblib: in parallel).
  A trial's value is what the job returns: the objective `sweep.objective` (else
  `trainer.objective`) of its Summary; a failed job, or a non-finite or missing value, is told
  to Optuna as FAIL (TPE ignores it) and the sweep goes on.
- The study is `<sweep dir>/optuna.db` (sqlite): rerunning the command with the same
  `hydra.sweep.dir` loads it and adds `n_trials` more trials, numbered after the earlier jobs.
"""

import math
import os
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from hydra.core.plugins import Plugins

from stack.errors import ConfigError, short
from stack.launch.report import direction as metric_direction


def distribution(override: Override) -> Any:
    """The Optuna distribution of a sweep override (interval, range, choice, tag(log, ...))."""
    import optuna.distributions as d  # optuna (~0.5 s to import): only when a sweep runs

    sweep, log = override.value(), "log" in getattr(override.value(), "tags", set())
    if isinstance(sweep, IntervalSweep):
        return d.FloatDistribution(float(sweep.start), float(sweep.end), log=log)
    if isinstance(sweep, RangeSweep):
        values = (sweep.start, sweep.stop, sweep.step)
        if all(isinstance(v, int) for v in values):
            return d.IntDistribution(sweep.start, sweep.stop - sweep.step, step=sweep.step, log=log)
        return d.FloatDistribution(float(sweep.start), float(sweep.stop) - float(sweep.step), step=float(sweep.step))
    if isinstance(sweep, ChoiceSweep):
        return d.CategoricalDistribution([v if isinstance(v, (int, float, bool, str)) else str(v) for v in sweep.list])
    raise ConfigError(f"'{override.input_line}': hydra/sweeper=optuna takes interval(), range(), choice() / a,b,c "
                      "and tag(log, ...) sweeps.")


def search_space(arguments: list[str]) -> tuple[dict[str, Any], list[str]]:
    """(name -> distribution, the fixed overrides every trial gets) of the command's overrides."""
    space, fixed = {}, []
    for override in OverridesParser.create().parse_overrides(arguments):
        if override.is_sweep_override():
            space[override.get_key_element()] = distribution(override)
        else:
            fixed.append(override.input_line)
    if not space:
        raise ConfigError("hydra/sweeper=optuna found nothing to search: give at least one sweep, e.g. "
                          "'optimizer.lr=tag(log,interval(1e-4,1e-2))' or 'algorithm.beta=choice(0.05,0.1)'.")
    return space, fixed


def study_direction(direction: str, objective: str) -> str:
    if direction == "auto":
        return "maximize" if metric_direction(objective) == "max" else "minimize"
    if direction not in ("minimize", "maximize"):
        raise ConfigError(f"'hydra.sweeper.direction'={direction!r}: use minimize, maximize or auto.")
    return direction


def open_study(sweep_dir: str, name: str, direction: str, seed: int) -> Any:
    """The study in `<sweep_dir>/optuna.db`, created or loaded (a rerun continues it)."""
    import optuna  # as in distribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    os.makedirs(sweep_dir, exist_ok=True)
    db = os.path.join(sweep_dir, "optuna.db")
    try:
        return optuna.create_study(study_name=name, storage=f"sqlite:///{db}", load_if_exists=True,
                                   direction=direction, sampler=optuna.samplers.TPESampler(seed=seed))
    except Exception as exc:  # SQLAlchemy's errors (a damaged or locked file), Optuna's (another direction)
        why = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        todo = ("another sweep still running there holds it: wait for it to end" if "locked" in why else
                "it is not a study of this sweep: move it away")
        raise ConfigError(f"The Optuna study {name!r} in {db!r} cannot be opened ({short(why, 200)}); {todo}, or "
                          "give this sweep a new hydra.sweep.dir. Nothing was run.") from None


def trial_value(job: Any) -> float | None:
    """A finished job's objective, or None when it failed or returned nothing finite."""
    try:
        value = job.return_value
    except Exception:  # the launcher re-raises a job's exception here
        return None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def run_trials(study: Any, space: dict[str, Any], fixed: list[str], launch: Any, n_trials: int,
               n_jobs: int) -> None:
    """`n_trials` more trials, `n_jobs` at a time: ask, launch as Hydra jobs, tell."""
    import optuna  # as in distribution

    done = 0
    while done < n_trials:
        trials = [study.ask(space) for _ in range(min(n_jobs, n_trials - done))]
        batch = [fixed + [f"{k}={v}" for k, v in t.params.items()] for t in trials]
        for trial, job in zip(trials, launch(batch, initial_job_idx=trials[0].number), strict=True):
            value = trial_value(job)
            if value is None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, value)
        done += len(trials)


def register_sweeper() -> None:
    """Hydra finds `hydra_plugins.stack_sweeper` by scanning that namespace package, which misses
    an editable install's import hook: register the class by hand (Plugins.register)."""
    try:  # the plugin package: installed with stack, absent from a bare checkout
        from hydra_plugins.stack_sweeper import OptunaSweeper
    except ImportError:  # a bare checkout, not installed: hydra/sweeper=optuna is unavailable
        return
    Plugins.instance().register(OptunaSweeper)
