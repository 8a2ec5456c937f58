"""One owner per run dir: an exclusive `flock` on `<run_dir>/.lock`, taken before the run
writes anything there and held until it ends.

The kernel drops the lock when its process dies (kill -9 included), so a stale lock never
blocks: the next run takes it over and says whose it was. The file holds the owner's pid and
host while it runs and is emptied on a clean exit, so leftover text means its owner died.
"""

import fcntl
import itertools
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from stack.checkpoint.job_status import read_status
from stack.errors import ConfigError, RunDirInUse, RunDirRefused

LOCK = ".lock"


@contextmanager
def owned(run_dir: str) -> Iterator[None]:
    """Hold `run_dir` for this process; a ConfigError at once if another live run holds it."""
    creatable(run_dir, "run_dir")
    fd, held = os.open(os.path.join(run_dir, LOCK), os.O_RDWR | os.O_CREAT, 0o644), False
    try:
        previous = os.read(fd, 512).decode(errors="replace").strip()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirInUse(
                f"run_dir {run_dir!r} is in use by {previous or 'another process'}: a run dir has one "
                "owner. Wait for that run to end (or stop it), or give this one another run_dir=PATH.") from None
        held = True
        if previous:
            print(f"run_dir lock: {previous} did not exit cleanly; taking the run dir over", flush=True)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()} since {time.ctime()}".encode(), 0)
        yield
    finally:
        if held:  # any exit Python sees (an error too) leaves an empty file; kill -9 leaves the pid
            os.ftruncate(fd, 0)
        os.close(fd)  # releases the lock


def unclaimed(path: str, key: str) -> str:
    """`path`, else `path-1`, `path-2`, ...: the first one this call creates (`os.mkdir` is atomic),
    so two runs started in the same second on Hydra's default `outputs/DATE/H-M-S` get a dir each."""
    creatable(os.path.dirname(path) or ".", key)
    for i in itertools.count():
        try:
            os.mkdir(path if i == 0 else f"{path}-{i}")
            return path if i == 0 else f"{path}-{i}"
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def creatable(path: str, key: str, keep: bool = True) -> None:
    """Make the directory `path` (and its parents) or raise a ConfigError naming `key` and why not.
    `keep=False` only checks: what it made is removed again (e.g. for `--cfg job`, which runs nothing)."""
    top = os.path.abspath(path)
    while not os.path.exists(os.path.dirname(top)):
        top = os.path.dirname(top)  # the topmost directory this call makes
    made = not os.path.exists(path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"'{key}'={path!r} cannot be created ({exc.strerror or exc}): point it at a directory "
                          "you can write, e.g. under your home or the current directory.") from None
    d = os.path.abspath(path)
    while made and not keep:
        os.rmdir(d)
        made, d = d != top, os.path.dirname(d)


def check_not_completed(run_dir: str) -> None:
    """Refuse to start over in a run dir whose run completed (its status.json) when this run has no
    checkpoint to resume from: it would replace that run's config.yaml and status.json and add
    its rows to that run's metrics.jsonl."""
    status = read_status(run_dir) or {}
    if status.get("status") == "completed":
        raise RunDirRefused(
            f"run_dir {run_dir!r} holds a completed run (status.json: step {status.get('step')}) and this run has "
            "no checkpoint there to resume from (checkpoint=none, or that run saved none), so it would start over "
            "on top of it, overwriting its config.yaml and metrics.jsonl. Give this run another run_dir=PATH, or "
            "delete that directory first.")
