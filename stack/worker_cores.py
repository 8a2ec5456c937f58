"""Give each worker of a parallel sweep (`hydra/launcher=joblib`, n_jobs > 1) its own share of
this machine's cores, on CPU runs.

Unpinned, every worker's XLA thread pool spans all cores: on 2 cores two tiny-recipe jobs ran at
~0.6 of one job's speed each, below what one core alone gives a job (~0.65). A worker claims the
first free slot of n_jobs (an flock'd file under `<sweep dir>/.cores/`, held while the worker
process lives, so a slot frees itself when its worker exits or dies) and pins itself to that
slot's contiguous share of the cores before jax starts: XLA sizes its thread pool from the
affinity mask.
"""

import fcntl
import os
from typing import IO

_slot: list[IO[str]] = []  # the claimed slot's open, locked file: kept for the process's life


def share(cores: list[int], slot: int, n_jobs: int) -> list[int]:
    """Slot `slot`'s contiguous share of `cores` among n_jobs workers (wrapping when n_jobs
    exceeds the cores)."""
    n = min(n_jobs, len(cores))
    i = slot % n
    return cores[i * len(cores) // n:(i + 1) * len(cores) // n]


def worker_cores() -> list[int] | None:
    """The host cores this process may run on (None where the OS does not say: macOS)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def pin_worker(sweep_dir: str, n_jobs: int) -> list[int] | None:
    """Claim a free slot and pin this process to its cores; the cores, or None when there is
    nothing to split (one job at a time, one core), this process already holds a slot, or every
    slot is taken."""
    cores = worker_cores()
    if cores is None or n_jobs < 2 or len(cores) < 2 or _slot:
        return None
    folder = os.path.join(sweep_dir, ".cores")
    os.makedirs(folder, exist_ok=True)
    for slot in range(n_jobs):
        f = open(os.path.join(folder, f"{slot}.lock"), "w")  # noqa: SIM115 (held open on purpose)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        _slot.append(f)
        mine = share(cores, slot, n_jobs)
        os.sched_setaffinity(0, mine)
        return mine
    return None
