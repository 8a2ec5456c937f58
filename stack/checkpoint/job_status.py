"""A job's `status.json` in its run dir: how it ended (completed, preempted, stopped_nonfinite,
failed), its objective and wall time. Sweep reports read it, and a multirun's parent process
reads it to exit 1 when a job failed, whichever launcher ran the job (in process or not).

A sweep job refused its run dir (another run's: in use, completed, checkpoints of another
config) leaves that run's status.json alone and writes `refused.json` beside it instead."""

import json
import os
from typing import Any

FILE = "status.json"
REFUSED = "refused.json"


def write_status(run_dir: str, status: str, file: str = FILE, **fields: Any) -> None:
    """Replace `run_dir`'s status (or `file`) atomically (a reader never sees half a file)."""
    os.makedirs(run_dir, exist_ok=True)
    tmp = os.path.join(run_dir, f".{file}.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump({"status": status, **fields}, f, indent=1, default=str)
    os.replace(tmp, os.path.join(run_dir, file))


def read_status(run_dir: str, file: str = FILE) -> dict[str, Any] | None:
    """The status a job wrote, or None (not finished, or killed before it could write)."""
    try:
        with open(os.path.join(run_dir, file)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def job_outcome(run_dir: str) -> dict[str, Any]:
    """How the job's last invocation ended: its status, or its refusal when that is newer (with
    the dir's run's objective, value and seconds)."""
    status, refused = read_status(run_dir), read_status(run_dir, REFUSED)
    if refused and (status is None or os.path.getmtime(os.path.join(run_dir, REFUSED))
                    >= os.path.getmtime(os.path.join(run_dir, FILE))):
        return {**(status or {}), **refused}
    return status or {"status": "unfinished"}
