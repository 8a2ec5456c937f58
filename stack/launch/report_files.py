"""The files of a sweep report (stack.launch.report): each written whole or not at all (a temporary
file beside it, renamed over it when complete), and its plots (matplotlib, headless; matplotlib and
optuna are imported only when a report is drawn, not on the CLI's path)."""

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

Curve = list[tuple[int, float]]


@contextmanager
def replaced(path: str) -> Iterator[str]:
    """A temporary path beside `path` (same extension: matplotlib reads the format from it) that
    replaces `path` when the block ends without an error; removed otherwise."""
    base, ext = os.path.splitext(os.path.basename(path))
    tmp = os.path.join(os.path.dirname(path), f".{base}.{os.getpid()}.partial{ext}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _pyplot() -> Any:
    import matplotlib  # see the module docstring

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after the headless backend is chosen

    return plt


def plot_curves(curves: list[tuple[str, Curve]], metric: str, path: str) -> None:
    """One line per job (its label, its (step, value) points) of `metric` over steps."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, curve in curves:
        ax.plot(*zip(*curve, strict=True), marker="o", label=label)
    ax.set(xlabel="step", ylabel=metric, title=f"{metric} per job")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with replaced(path) as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)


def optuna_plots(sweep_dir: str) -> list[str]:
    """The files the Optuna plots of `sweep_dir` would be (none without its `optuna.db`)."""
    has_db = os.path.isfile(os.path.join(sweep_dir, "optuna.db"))
    return ["optuna_history.png", "optuna_importances.png"] if has_db else []


def plot_optuna(sweep_dir: str) -> list[str]:
    """Optimisation history (whole trial numbers) and parameter importances of the sweep's Optuna
    study; a study db that cannot be read is one warning and no plot."""
    if not optuna_plots(sweep_dir):
        return []
    plt = _pyplot()
    import optuna  # see the module docstring

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{os.path.join(sweep_dir, 'optuna.db')}"
    try:
        studies = [optuna.load_study(study_name=n, storage=storage) for n in optuna.get_all_study_names(storage)]
    except Exception as exc:  # SQLAlchemy's errors: a damaged or locked file
        why = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        warnings.warn(f"{storage[10:]} cannot be read ({why}): no Optuna plots", stacklevel=2)
        return []
    written = []
    for study in studies:
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        plots = [("optuna_history.png", optuna.visualization.matplotlib.plot_optimization_history)]
        if len(done) >= 2 and len({k for t in done for k in t.params}) >= 1:
            plots.append(("optuna_importances.png", optuna.visualization.matplotlib.plot_param_importances))
        for file, plot in plots:
            with warnings.catch_warnings():  # optuna marks its matplotlib plots experimental
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                ax = plot(study)
            _tidy(ax, file)
            with replaced(os.path.join(sweep_dir, file)) as tmp:
                ax.figure.savefig(tmp, dpi=100)
            plt.close(ax.figure)
            written.append(file)
    return written


def _tidy(ax: Any, file: str) -> None:
    """Whole trial numbers on the history's x axis; no legend over the importance bars (one
    objective: the title names it)."""
    from matplotlib.ticker import MaxNLocator  # see the module docstring

    if file == "optuna_history.png":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    elif ax.get_legend() is not None:
        ax.get_legend().remove()
    ax.figure.tight_layout()
