"""A job's `status.json` in its run dir: how it ended (completed, preempted, stopped_nonfinite,
failed), its objective and wall time. Sweep reports read it, and a multirun's parent process
reads it to exit 1 when a job failed, whichever launcher ran the job (in process or not)."""

import json
import os
from typing import Any

FILE = "status.json"


def write_status(run_dir: str, status: str, **fields: Any) -> None:
    """Replace `run_dir`'s status atomically (a reader never sees half a file)."""
    os.makedirs(run_dir, exist_ok=True)
    tmp = os.path.join(run_dir, f".{FILE}.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump({"status": status, **fields}, f, indent=1, default=str)
    os.replace(tmp, os.path.join(run_dir, FILE))


def read_status(run_dir: str) -> dict[str, Any] | None:
    """The status a job wrote, or None (not finished, or killed before it could write)."""
    try:
        with open(os.path.join(run_dir, FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
