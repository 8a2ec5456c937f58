"""Library log records (Orbax's and Grain's absl lines, jax's, asyncio's) go to the run dir's
`run.log` at full detail (INFO and up, tracebacks included), not to the console: a user cannot act
on them, and a failed save printed ~480 lines of Orbax ERROR tracebacks before its one paragraph.
The libraries' loggers stop propagating to the root logger's console handlers meanwhile (whoever
added those: Hydra's job logging, jax at import); stack's and Hydra's records are untouched. Rank
i > 0 of a multi-process run writes `run.rank<i>.log`. The file is created at its first record
and appended to on a rerun.
"""

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

LIBRARIES = ("absl", "jax", "jaxlib", "orbax", "grain", "flax", "optax", "qwix", "etils", "asyncio")
FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def log_file(run_dir: str, rank: int) -> str:
    """The library log of process `rank` in `run_dir`."""
    return os.path.join(run_dir, "run.log" if rank == 0 else f"run.rank{rank}.log")


@contextmanager
def library_log(run_dir: str, rank: int = 0) -> Iterator[str]:
    """Within: the LIBRARIES' records at INFO and up go to `log_file(run_dir, rank)` only; the path."""
    path = log_file(run_dir, rank)
    os.makedirs(run_dir, exist_ok=True)
    file = logging.FileHandler(path, delay=True)
    file.setFormatter(logging.Formatter(FORMAT))
    loggers = [logging.getLogger(name) for name in LIBRARIES]
    before = [(lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.addHandler(file)
        lg.propagate = False
        lg.setLevel(logging.INFO)
    try:
        yield path
    finally:
        for lg, (level, propagate) in zip(loggers, before, strict=True):
            lg.removeHandler(file)
            lg.setLevel(level)
            lg.propagate = propagate
        file.close()
