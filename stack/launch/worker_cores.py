"""Give each worker of a parallel sweep (`hydra/launcher=joblib`, n_jobs > 1) its own share of
this machine's cores, on CPU runs.

Unpinned, every worker's XLA thread pool spans all cores and they fight over them: jobs run
faster pinned to a share each. A worker claims the first free slot of n_jobs (an flock'd file
under `<sweep dir>/.cores/`, held while the worker process lives, so a slot frees itself when its
worker exits or dies) and pins itself to that slot's contiguous share of the cores before jax
starts: XLA sizes its thread pool from the affinity mask, and malloc its arenas
(stack.hardware.host_memory, two per core of the mask).
"""

import fcntl
import os
from typing import IO, Any

from stack.hardware.host_memory import keep_freed_host_memory

_slot: list[IO[str]] = []  # the claimed slot's open, locked file: kept for the process's life


def process_workers(launcher: Any) -> int | None:
    """How many jobs a multirun's launcher config runs at once in worker processes (joblib's
    n_jobs; -1: all cores, -2: all but one); None for launchers that run jobs in this process
    or in threads (joblib's `backend=threading`, `prefer=threads`, `require=sharedmem`)."""
    n_jobs, backend = launcher.get("n_jobs"), launcher.get("backend")
    threads = backend == "threading" or (backend is None and (launcher.get("prefer") == "threads"
                                                              or launcher.get("require") == "sharedmem"))
    if not n_jobs or threads:
        return None
    return n_jobs if n_jobs > 0 else (os.cpu_count() or 1) + 1 + n_jobs


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


def tune_host(sweep_dir: str, n_jobs: int | None) -> list[int] | None:
    """Before jax starts its threads on a CPU run: a worker of a parallel sweep (n_jobs > 1) takes its
    share of the cores, then malloc keeps freed pages with two arenas per core it has (in this
    order: counted before pinning, a 1-core worker of a 2-core machine had four arenas, and its XLA
    dispatch thread shared one holding 70 MB of long-lived data; see stack.hardware.host_memory for what
    that cost). The worker's cores, or None when unpinned."""
    cores = pin_worker(sweep_dir, n_jobs) if n_jobs else None
    keep_freed_host_memory()
    return cores
