"""Library log records (Orbax's absl lines, Grain's, jax's) go to the run dir's `run.log` at full
detail (INFO and up, tracebacks included), not to the console: a user cannot act on them, and a
failed save printed ~480 lines of Orbax ERROR tracebacks before its one paragraph. The console
keeps stack's and Hydra's own records at the level it had. Rank i > 0 of a multi-process run
writes `run.rank<i>.log`. The file is created at its first record and appended to on a rerun.
"""

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

ON_CONSOLE = ("stack", "hydra", "__main__")  # top-level logger names whose records stay on the console
FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


class _Console(logging.Filter):
    """Lets through the console's own records (ON_CONSOLE) at `level` and up."""

    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level and record.name.split(".")[0] in ON_CONSOLE


def log_file(run_dir: str, rank: int) -> str:
    """The library log of process `rank` in `run_dir`."""
    return os.path.join(run_dir, "run.log" if rank == 0 else f"run.rank{rank}.log")


@contextmanager
def library_log(run_dir: str, rank: int = 0) -> Iterator[str]:
    """Within: every log record at INFO and up goes to `log_file(run_dir, rank)`, and the console
    handlers of the root logger keep only stack's and Hydra's; the path of the file."""
    root = logging.getLogger()
    level = root.getEffectiveLevel()
    path = log_file(run_dir, rank)
    os.makedirs(run_dir, exist_ok=True)
    file = logging.FileHandler(path, delay=True)
    file.setFormatter(logging.Formatter(FORMAT))
    console = _Console(level)
    streams = [h for h in root.handlers if isinstance(h, logging.StreamHandler)
               and not isinstance(h, logging.FileHandler)]
    for handler in streams:
        handler.addFilter(console)
    root.addHandler(file)
    root.setLevel(min(level, logging.INFO))
    try:
        yield path
    finally:
        root.setLevel(level)
        root.removeHandler(file)
        file.close()
        for handler in streams:
            handler.removeFilter(console)
