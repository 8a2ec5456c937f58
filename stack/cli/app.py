"""Entry point: check the command line, compose with Hydra, dispatch by `mode`.

Composition errors are caught in a preflight compose (pure Python, no jax) and shown as one
paragraph; `HYDRA_FULL_ERROR=1` shows the full traceback instead.
"""

import argparse
import os
import signal
import sys
import traceback
from collections.abc import Callable

import hydra
from hydra import compose, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType
from hydra.errors import ConfigCompositionException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from stack.checkpoint.rundir import creatable
from stack.cli.job import hydra_task, task
from stack.config.compose_errors import friendly_error
from stack.config.hf_config import take_architecture
from stack.config.jax_env import set_jax_env
from stack.config.pre_run import check_before_run
from stack.config.schema import CONFIG_MODULE, recipe_files
from stack.config.validate import validate
from stack.errors import ConfigError, bad_choice, exit_on, one_line_warnings, short
from stack.launch import hydra_job
from stack.launch.children import interrupted, own_stop_file
from stack.launch.local import end_failed_rank, launcher_for, one_of_several
from stack.launch.report import FAILED_JOBS
from stack.launch.slurm import check_submit_host, register_slurm
from stack.launch.sweeper import register_sweeper

register_sweeper()  # hydra/sweeper=optuna and hydra/launcher=slurm, before Hydra composes
register_slurm()


def available_recipes() -> list[str]:
    """Names usable as `+recipe=NAME` (the YAML files shipped in `recipes/`)."""
    return sorted(recipe_files())


def _override_sets(overrides: list[str]) -> list[list[str]]:
    """Override lists to check: the sweep's first job, then each other sweep value in turn.

    `hydra.*` overrides are Hydra's to check; interval sweeps (for optimizing sweepers)
    have no values to enumerate and are left to the sweeper.
    """
    fixed: list[str] = []
    sweeps: list[tuple[int, str, list[str]]] = []
    for o in _parsed(overrides):
        value = o.input_line.split("=", 1)[1] if "=" in o.input_line else ""
        if o.key_or_group in ("hydra.run.dir", "hydra.sweep.dir") and "${" not in value and "," not in value:
            creatable(value, o.key_or_group, keep=False)  # Hydra makes it (a job starts) with no check of ours
        if o.key_or_group.startswith("hydra"):
            continue
        if o.is_delete():  # ~key: no value to check
            fixed.append(o.input_line)
            continue
        values = [o.input_line.split("=", 1)[1]] if not o.is_sweep_override() else None
        if values == [""]:
            raise ConfigError(f"The override {short(o.input_line)!r} gives '{o.key_or_group}' no value: give one "
                              f"({o.key_or_group}=VALUE), write {o.key_or_group}='' for an empty string, or "
                              f"drop the key with ~{o.key_or_group}.")
        if values is None:
            try:
                values = list(o.sweep_string_iterator())
            except Exception:
                continue
        if o.key_or_group == "recipe" and not o.is_delete():
            for name in values:
                if name not in available_recipes():
                    raise bad_choice("+recipe", name, available_recipes(), what="recipe")
        if o.is_sweep_override():
            sweeps.append((len(fixed), o.get_key_element(), values))
        fixed.append(o.input_line if not o.is_sweep_override() else f"{o.get_key_element()}={values[0]}")
    sets = [fixed]
    for pos, key, values in sweeps:
        for value in values[1:]:
            sets.append(fixed[:pos] + [f"{key}={value}"] + fixed[pos + 1:])
    return sets


def last_wins(argv: list[str]) -> list[str]:
    """`argv` without the earlier overrides of a key set again later (Hydra's last-wins rule,
    applied before composing, so an earlier bad value is not what fails)."""
    keys = [a.split("=", 1)[0].lstrip("+") if "=" in a and not a.startswith("-") else None for a in argv]
    return [a for i, (a, k) in enumerate(zip(argv, keys, strict=True)) if k is None or k not in keys[i + 1:]]


def _parsed(overrides: list[str]) -> list[Override]:
    """Hydra's parse of each override; one that does not parse is a ConfigError naming it."""
    parser, parsed = OverridesParser.create(), []
    for line in overrides:
        try:
            parsed += parser.parse_overrides([line])
        except OverrideParseException as exc:
            raise ConfigError(
                f"Cannot parse the override {short(line)!r}: {short(str(exc).splitlines()[0], 160)}. The syntax is "
                "key=value, +key=value (add), ~key (delete), key=a,b (a sweep); quote a value with brackets, "
                "spaces or non-ASCII characters: 'key=\"value\"'.") from None
    return parsed


def _hydra_args(argv: list[str]) -> argparse.Namespace:
    """Hydra's reading of the command line (its flags: --cfg, --help, -m, ...)."""
    return hydra._internal.utils.get_args_parser().parse_args(last_wins(argv))


def _check_one_mode(args: argparse.Namespace) -> None:
    """Hydra takes one of -m, --run, --cfg, --info, --shell-completion (it raised a bare ValueError)."""
    modes = [flag for flag, on in (("-m (--multirun)", args.multirun), ("--run", args.run), ("--cfg", args.cfg),
                                   ("--info", args.info), ("--shell-completion", args.shell_completion)) if on]
    if len(modes) > 1:
        hint = ("to see one job's config, drop -m and give each swept key one of its values (seed=0,1 -> "
                "seed=0)" if args.multirun and args.cfg else "give one of them")
        raise ConfigError(f"{' and '.join(modes)} cannot be combined: a command runs, sweeps or shows one thing; "
                          f"{hint}.")


def _check_sweep_has_m(args: argparse.Namespace) -> None:
    """A sweep (key=a,b, range(), choice(), interval()) runs only with -m; Hydra's own error for one
    without it ("Ambiguous value ...") took five lines."""
    if args.multirun or any(o.lstrip("+~").startswith("hydra.mode") for o in args.overrides):
        return
    for o in _parsed(args.overrides):
        if o.is_sweep_override() and not o.key_or_group.startswith("hydra"):
            key, value = o.get_key_element(), short(o.input_line.split("=", 1)[1], 60)
            forms = (f"; a list value is written in brackets ({key}=[{value}]), a string with commas quoted "
                     f"(\"{key}='{value}'\")" if o.value_type == ValueType.SIMPLE_CHOICE_SWEEP else "")
            raise ConfigError(f"The override {short(o.input_line)!r} is a sweep over values of '{key}', and a sweep "
                              f"runs only with -m (--multirun): add -m to run one job per value, or give '{key}' "
                              f"one value{forms}.")


def preflight(argv: list[str]) -> DictConfig | None:
    """Compose and validate what `argv` asks for (each sweep value); raise ConfigError if bad.

    Returns the first job's config (None for --help and the like).
    """
    with initialize_config_module(CONFIG_MODULE, version_base=None):
        return composed(argv)[0]


def composed(argv: list[str]) -> tuple[DictConfig | None, DictConfig | None]:
    """(the first job's config or None, as `preflight`; for a plain run, its whole config as Hydra
    runs it, `hydra` node included (stack.launch.hydra_job), else None). GlobalHydra is initialized."""
    args = _hydra_args(argv)
    _check_one_mode(args)
    if args.help or args.hydra_help or args.info or args.shell_completion:
        return None, None
    _check_sweep_has_m(args)
    check_submit_host(args.overrides)
    sets = _override_sets(args.overrides)
    if _plain_run(args) and len(sets) == 1:  # one job: composed once, as Hydra runs it
        whole, job_cfg = _checked(lambda: hydra_job.compose_run(args.overrides), args.overrides, hydra_job.job_part)
        return job_cfg, whole
    cfg = None
    for overrides in sets:
        job_cfg = _checked(lambda: compose(config_name=args.config_name or "config", overrides=overrides), overrides)[1]
        cfg = cfg or job_cfg
    return cfg, None


def _plain_run(args: argparse.Namespace) -> bool:
    """A run of one job in this process, its config Hydra's default (what stack.launch.hydra_job runs)."""
    return not (args.multirun or args.cfg or args.config_name or args.config_path or args.config_dir
                or args.experimental_rerun or any(o.lstrip("+~").startswith("hydra.mode") for o in args.overrides))


def _checked(composed: Callable[[], DictConfig], overrides: list[str],
             job: Callable[[DictConfig], DictConfig] = lambda cfg: cfg) -> tuple[DictConfig, DictConfig]:
    """(`composed()`, its job part `job(...)`, validated); a composition or validation error is a ConfigError."""
    try:
        cfg = composed()
        job_cfg = job(cfg)
        take_architecture(job_cfg, overrides)
        validate(job_cfg)  # reads every value: a bad interpolation fails here
    except (ConfigCompositionException, OmegaConfBaseException, AssertionError, TypeError, ValueError,
            OSError) as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        raise friendly_error(exc, overrides) from exc
    return cfg, job_cfg


def main() -> None:
    """`python -m stack [overrides]`: preflight, then a plain run's job (stack.launch.hydra_job), else Hydra.
    Ctrl-C (and SIGTERM to a sweep): `interrupted` (in the loop, after its save); a failing rank exits
    at once (`end_failed_rank`)."""
    sys.argv[1:] = last_wins(sys.argv[1:])  # what Hydra composes, too
    one_line_warnings()
    try:
        _checked_and_run()
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM to a sweep (stack.launch.children.Stopped)
        interrupted(getattr(exc, "signum", signal.SIGINT))
    except SystemExit as exc:
        if exc.code not in (0, None) and one_of_several():
            if not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
            end_failed_rank(exc.code if isinstance(exc.code, int) else 1)
        raise
    except Exception:
        if one_of_several():  # HYDRA_FULL_ERROR=1: the traceback, then exit without waiting on the others
            traceback.print_exc()
            end_failed_rank(1)
        raise


def _checked_and_run() -> None:
    argv = sys.argv[1:]
    with initialize_config_module(CONFIG_MODULE, version_base=None):  # until a plain run's job ends
        with exit_on(ConfigError):
            cfg, whole = composed(argv)
            if cfg is not None and not _hydra_args(argv).cfg:  # before a run dir or its lock exists
                set_jax_env(cfg)  # the check imports jax
                check_before_run(cfg)
            launch = launcher_for(cfg, argv) if cfg is not None else None
            if whole is not None and launch is None:  # this process runs the job
                hydra_job.into_run_dir(whole, cfg, _hydra_args(argv).overrides)
        if launch is not None and not _hydra_args(argv).cfg:  # --cfg: Hydra prints the config, nothing starts
            sys.exit(launch())  # launcher=local / tpu_pod / xpk: this process only starts the job
        if whole is not None:
            hydra_job.run(whole, task)
            return
    if _hydra_args(argv).multirun:
        own_stop_file()  # before a sweep starts its workers: they inherit its name
        signal.signal(signal.SIGTERM, interrupted)  # as Ctrl-C: the jobs save, nothing is left running
    hydra_task()
    if FAILED_JOBS:
        print(f"{len(FAILED_JOBS)} job(s) failed:\n  " + "\n  ".join(FAILED_JOBS), file=sys.stderr)
        sys.exit(1)
