"""`python -m stack.launch.report SWEEP_DIR`: one table of a Hydra multirun (the overrides that vary,
the objective's final and best value, status, wall time), sorted by the objective; writes
`summary.csv` and `curves.png` (the objective per job over steps) into the sweep dir, and for an
Optuna sweep (`optuna.db` there) `optuna_history.png` and `optuna_importances.png`; `--metric X`
reads X instead and writes `summary-X.csv` and `curves-X.png`. From the command line, report files
that exist are kept unless `--overwrite`. `SweepReport` runs it at the end of every multirun (a
Hydra callback in conf/config.yaml), rewriting that sweep's report, and collects the failed jobs
(their `status.json`, or a rerun's `refused.json`) into FAILED_JOBS for the exit code.
"""

import argparse
import csv
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml
from hydra.experimental.callback import Callback

from stack.checkpoint.job_status import job_outcome
from stack.errors import ConfigError, exit_on, one_line_warnings, short
from stack.launch.report_files import optuna_plots, plot_curves, plot_optuna, replaced

FAILED_JOBS: list[str] = []
MAXIMIZED = ("accurac", "reward", "margin", "score")  # metric names whose larger values are better


@dataclass
class Job:
    name: str
    overrides: dict[str, str]
    status: str
    objective: str | None
    final: float | None
    best: float | None
    seconds: float | None
    error: str = ""
    curve: list[tuple[int, float]] = field(default_factory=list)


def direction(metric: str) -> str:
    """`max` for accuracies, rewards, margins and scores, else `min` (losses)."""
    return "max" if any(word in metric for word in MAXIMIZED) else "min"


def _rows(path: str) -> list[dict[str, Any]]:
    """The rows of a `metrics.jsonl`; a line that is not a JSON object (cut by a kill) is skipped."""
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return [r for r in rows if isinstance(r, dict) and isinstance(r.get("step"), int)]


def _overrides(job_dir: str) -> dict[str, str]:
    """A job's `.hydra/overrides.yaml` as key -> value; ConfigError naming the file if it is not one."""
    path = os.path.join(job_dir, ".hydra", "overrides.yaml")
    try:
        with open(path) as f:
            lines = yaml.safe_load(f) or []
        if not (isinstance(lines, list) and all(isinstance(o, str) for o in lines)):
            raise ValueError(f"a {type(lines).__name__}, not a list of overrides")
    except (OSError, ValueError, yaml.YAMLError) as exc:  # yaml's errors: a python tag is never constructed
        why = short(" ".join(str(exc).split()), 160)
        raise ConfigError(f"{path!r} cannot be read as a Hydra job's overrides ({type(exc).__name__}: {why}); "
                          "that job dir is damaged: move it out of the sweep dir (or rerun the sweep to "
                          "rewrite it).") from None
    return dict(o.split("=", 1) for o in lines if "=" in o)


def read_job(job_dir: str, metric: str | None) -> Job:
    """A job of a sweep from its `.hydra/overrides.yaml`, `status.json` and `metrics.jsonl`."""
    overrides = _overrides(job_dir)
    status = job_outcome(job_dir)
    metric = metric or status.get("objective")
    curve = [(r["step"], r[metric]) for r in _rows(os.path.join(job_dir, "metrics.jsonl"))
             if metric in r and isinstance(r[metric], (int, float)) and math.isfinite(r[metric])]
    values = [v for _, v in curve]
    best = (max if direction(metric or "") == "max" else min)(values) if values else None
    # no metrics.jsonl (logger without jsonl): the objective's final value from status.json
    final = values[-1] if values else status.get("value") if metric == status.get("objective") else None
    return Job(os.path.basename(job_dir), overrides, status["status"], metric, final, best, status.get("seconds"),
               status.get("error", ""), curve)


def read_sweep(sweep_dir: str, metric: str | None = None) -> list[Job]:
    """Every job of `sweep_dir` (a subdir with `.hydra/overrides.yaml`), in job order."""
    if not os.path.isdir(sweep_dir):
        raise ConfigError(f"{sweep_dir!r} is not a directory (give a Hydra multirun sweep dir).")
    dirs = [d for d in os.listdir(sweep_dir) if os.path.isfile(os.path.join(sweep_dir, d, ".hydra", "overrides.yaml"))]
    if not dirs:
        one = os.path.isfile(os.path.join(sweep_dir, "metrics.jsonl"))
        raise ConfigError(f"{sweep_dir!r} holds no Hydra jobs (subdirs with .hydra/overrides.yaml)" + (
            f": it is one run's dir; give the multirun dir of a sweep (python -m stack -m ...), and read this run's "
            f"metrics in {os.path.join(sweep_dir, 'metrics.jsonl')}." if one else "."))
    dirs.sort(key=lambda d: (not d.isdigit(), int(d) if d.isdigit() else 0, d))
    return [read_job(os.path.join(sweep_dir, d), metric) for d in dirs]


def varying(jobs: list[Job]) -> list[str]:
    """The override keys whose values differ between jobs (all of them for a single job)."""
    keys = sorted({k for j in jobs for k in j.overrides})
    return [k for k in keys if len(jobs) == 1 or len({j.overrides.get(k) for j in jobs}) > 1]


def ranked(jobs: list[Job]) -> list[Job]:
    """Jobs by objective, best first; jobs without a value last."""
    metric = next((j.objective for j in jobs if j.objective), "")
    sign = -1 if direction(metric) == "max" else 1
    return sorted(jobs, key=lambda j: (j.final is None, sign * j.final if j.final is not None else 0))


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


def _value(text: str) -> str:
    """An override value for the table: a float Optuna drew (0.3053540542751055) to 4 significant
    digits, as typed otherwise (1e-3, cpu); summary.csv keeps them exact."""
    try:
        short_form = f"{float(text):.4g}"
    except ValueError:
        return text
    return short_form if len(short_form) < len(text) and not text.isdigit() else text


def table(jobs: list[Job]) -> str:
    """The text table, best job first."""
    keys = varying(jobs)
    metric = next((j.objective for j in jobs if j.objective), "objective")
    head = ["job", *keys, f"{metric} (final)", "best", "status", "seconds"]
    rows = [[j.name, *(_value(j.overrides.get(k, "")) for k in keys), _fmt(j.final), _fmt(j.best), j.status,
             _fmt(j.seconds)]
            for j in ranked(jobs)]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *rows])


def write_csv(jobs: list[Job], path: str) -> None:
    keys = varying(jobs)
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["job", *keys, "objective", "final", "best", "status", "seconds", "error"])
        for j in ranked(jobs):
            out.writerow([j.name, *(j.overrides.get(k, "") for k in keys), j.objective, j.final, j.best,
                          j.status, j.seconds, j.error])


def report_files(sweep_dir: str, metric: str | None) -> list[str]:
    """The files a report writes into `sweep_dir`: summary.csv, curves.png and the Optuna plots for
    the jobs' objective; `summary-METRIC.csv` and `curves-METRIC.png` for another `metric`."""
    if metric is None:
        return ["summary.csv", "curves.png", *optuna_plots(sweep_dir)]
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", metric)
    return [f"summary-{tag}.csv", f"curves-{tag}.png"]


def report(sweep_dir: str, metric: str | None = None, overwrite: bool = True) -> str:
    """Read the sweep, write its report files (an existing one is kept unless `overwrite`, and
    then none is written); the text to print."""
    jobs = read_sweep(sweep_dir, metric)
    text = f"sweep {sweep_dir}: {len(jobs)} jobs\n{table(jobs)}"
    names = report_files(sweep_dir, metric)
    if not overwrite and (there := [n for n in names if os.path.exists(os.path.join(sweep_dir, n))]):
        return f"{text}\nkept {', '.join(there)} (they exist: --overwrite rewrites them)"
    table_file, curves_file = names[:2]
    with replaced(os.path.join(sweep_dir, table_file)) as tmp:
        write_csv(jobs, tmp)
    drawn, keys = [j for j in jobs if j.curve], varying(jobs)
    if drawn:
        plot_curves([(f"{j.name}: " + (" ".join(f"{k}={_value(j.overrides.get(k, ''))}" for k in keys) or j.name),
                      j.curve) for j in drawn], drawn[0].objective or "", os.path.join(sweep_dir, curves_file))
    files = [table_file, *([curves_file] if drawn else []), *(plot_optuna(sweep_dir) if metric is None else [])]
    return f"{text}\nwrote {', '.join(files)}"


def sweep_group(sweep_dir: str) -> str:
    """The wandb group of a sweep's runs: its sweep dir as one name."""
    return sweep_dir.replace("/", "_").strip("_")


def log_to_wandb(jobs: list[Job], sweep_dir: str, logger: Any) -> None:
    """The summary table as a wandb Table in a run of its own, in the sweep's group."""
    from stack.logging.wandb_sink import WandbSink  # wandb (~1 s to import): only for a wandb sweep

    keys = varying(jobs)
    columns = ["job", *keys, "objective", "final", "best", "status", "seconds"]
    rows = [[j.name, *(j.overrides.get(k, "") for k in keys), j.objective, j.final, j.best, j.status, j.seconds]
            for j in ranked(jobs)]
    sink = WandbSink(logger, sweep_dir, {"sweep_dir": sweep_dir}, group=sweep_group(sweep_dir), name="summary",
                     job_type="sweep")
    sink.log_table("sweep/summary", columns, rows)
    sink.close()


class SweepReport(Callback):
    """Hydra callback: the report after every multirun (and with logger=wandb its table as a
    wandb run), and its failed jobs into FAILED_JOBS."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = str(config.hydra.sweep.dir)
        try:
            jobs = read_sweep(sweep_dir)
        except ConfigError:
            return  # no job ran (e.g. interrupted before the first)
        FAILED_JOBS.extend(f"{sweep_dir}/{j.name}: {j.error or j.status}" for j in jobs
                           if j.status in ("failed", "refused", "unfinished", "stopped_nonfinite"))
        print(report(sweep_dir), flush=True)
        logger = config.get("logger")
        if logger is not None and logger.get("wandb") and logger.get("mode") != "disabled":
            log_to_wandb(jobs, sweep_dir, logger)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stack.launch.report", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", help="a Hydra multirun dir, e.g. multirun/DATE/TIME")
    parser.add_argument("--metric", default=None, help="default: each job's objective (trainer.objective); "
                        "another metric's table and curves go to summary-METRIC.csv and curves-METRIC.png")
    parser.add_argument("--overwrite", action="store_true", help="rewrite report files that exist")
    args = parser.parse_args(argv)
    one_line_warnings()
    with exit_on(ConfigError):  # exit 2, as every stack command given a bad argument
        print(report(args.sweep_dir, args.metric, args.overwrite))


if __name__ == "__main__":
    main(sys.argv[1:])
