"""Host process tuning: malloc keeps freed pages on CPU runs (stack.hardware.host_memory), parallel sweep
workers split the cores (stack.launch.worker_cores), imports run without cyclic collections
(stack.hardware.gc_freeze). Each case runs in its own process: they change process-wide state."""

import json
import os
import subprocess
import sys

import pytest

from stack.launch.worker_cores import process_workers, share

TWO_CORES = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                               reason="needs 2 cores and sched_setaffinity")

FAULTS = """
import ctypes, resource, sys, threading
from stack.hardware.host_memory import keep_freed_host_memory
took = keep_freed_host_memory() if sys.argv[1] != "default" else None
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
if sys.argv[1] == "no-top-pad":
    libc.mallopt(-2, 0)  # M_TOP_PAD back to glibc's default
held, size = int(sys.argv[3]), int(sys.argv[4]) << 20  # MiB of long-lived blocks, MiB a step


def steps():  # a step's temporary, as XLA:CPU mallocs it: written through, freed
    kept = [libc.malloc(1 << 20) for _ in range(held)]  # long-lived data in the thread's arena
    for _ in range(20):
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)
        libc.free(block)
    return kept


before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
threads = [threading.Thread(target=steps) for _ in range(int(sys.argv[2]))]  # XLA's pool: an arena each
for t in threads:
    t.start()
for t in threads:
    t.join()
if not threads:
    steps()
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str, threads: int, held_mib: int = 0, block_mib: int = 40) -> tuple[str, int]:
    args = [mode, str(threads), str(held_mib), str(block_mib)]
    out = subprocess.run([sys.executable, "-c", FAULTS, *args], capture_output=True, text=True, check=True)
    took, n = out.stdout.split()
    return took, int(n)


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt: Linux only")
@pytest.mark.parametrize("threads", [0, 3])
def test_kept_host_memory_is_reused_instead_of_faulted_in_again(threads):
    """In the main thread and in 3 threads at once (their own arenas: no shared lock)."""
    took, kept = faults("keep", threads)
    _, default = faults("default", threads)
    assert took == "True"
    pages = max(threads, 1) * 20 * (40 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert default > 0.9 * pages, "glibc's default unmaps each 40 MiB block on free: its pages fault in again"
    assert kept < 0.2 * pages, f"{kept} page faults for 20 uses of one 40 MiB block per thread"


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt: Linux only")
def test_a_thread_whose_first_heap_is_full_keeps_its_second_heap():
    """56 MiB of long-lived blocks fill most of a thread arena's first 64 MiB heap; each 16 MiB step
    block then lives in a second heap, which glibc deletes when it empties unless the top pad is kept."""
    took, kept = faults("keep", 1, held_mib=56, block_mib=16)
    _, unpadded = faults("no-top-pad", 1, held_mib=56, block_mib=16)
    pages = 20 * (16 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert took == "True"
    assert unpadded > 0.9 * pages, "without the top pad the emptied second heap goes and faults in again"
    assert kept < 0.2 * pages, f"{kept} page faults for 20 uses of one 16 MiB block"


def test_share_gives_each_slot_a_contiguous_part_and_wraps_past_the_cores():
    assert [share([0, 1, 2, 3], s, 2) for s in (0, 1)] == [[0, 1], [2, 3]]
    assert [share([0, 1, 2, 3, 4], s, 3) for s in (0, 1, 2)] == [[0], [1, 2], [3, 4]]  # i*5//3: 0, 1, 3, 5
    assert [share([4, 6], s, 4) for s in range(4)] == [[4], [6], [4], [6]]


def test_only_process_workers_are_counted_and_negative_n_jobs_count_back_from_the_cores():
    cores = os.cpu_count()
    assert process_workers({"n_jobs": 2}) == 2  # joblib's defaults: loky processes
    assert process_workers({"n_jobs": -1}) == cores and process_workers({"n_jobs": -2}) == cores - 1
    assert process_workers({}) is None  # the basic launcher: jobs in this process
    for threads in ({"backend": "threading"}, {"prefer": "threads"}, {"require": "sharedmem"}):
        assert process_workers({"n_jobs": 2, **threads}) is None, threads
    assert process_workers({"n_jobs": 2, "backend": "loky", "prefer": "threads"}) == 2  # an explicit backend wins


PIN = """
import sys
from stack.launch.worker_cores import pin_worker
print(pin_worker(sys.argv[1], 2), flush=True)
sys.stdin.read()  # hold the slot until the test closes stdin
"""


@TWO_CORES
def test_workers_claim_distinct_slots_and_a_dead_workers_slot_frees(tmp_path):
    cores = sorted(os.sched_getaffinity(0))

    def worker() -> tuple[subprocess.Popen, str]:
        p = subprocess.Popen([sys.executable, "-c", PIN, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        return p, p.stdout.readline().strip()

    (a, got_a), (b, got_b) = worker(), worker()
    assert {got_a, got_b} == {str(share(cores, 0, 2)), str(share(cores, 1, 2))}
    c, got_c = worker()
    assert got_c == "None", "both slots are held: a third worker stays unpinned"
    a.kill()
    a.wait()
    d, got_d = worker()
    assert got_d == got_a, "the killed worker's slot is free again"
    for p in (b, c, d):
        p.stdin.close()
        p.wait()


COLLECTOR = """
import gc, json
from stack.hardware.gc_freeze import frozen_imports
starts = []
gc.callbacks.append(lambda phase, info: starts.append(info["generation"]) if phase == "start" else None)
with frozen_imports("wave"):
    import wave
    inside = gc.isenabled()
    kept = [[] for _ in range(100_000)]  # 100,000 container allocations: ~140 collections if on
first = {"inside": inside, "runs": len(starts), "on": gc.isenabled(), "frozen": gc.get_freeze_count()}
with frozen_imports("wave"):  # imported already: a later job's import, collection as usual
    more = [[] for _ in range(100_000)]
print(json.dumps([first, {"runs": len(starts), "frozen": gc.get_freeze_count()}]))
"""


def test_an_import_runs_without_cyclic_collections_and_leaves_its_heap_frozen():
    out = subprocess.run([sys.executable, "-c", COLLECTOR], capture_output=True, text=True, check=True)
    first, second = json.loads(out.stdout)
    assert first["inside"] is False and first["runs"] == 0, first
    assert first["on"] is True, "collection is back on after the import"
    assert first["frozen"] > 100_000, "what is alive after the import is frozen: full collections skip it"
    assert second["runs"] > 100, "a second import of the same module changes nothing: collections run"
    assert second["frozen"] == first["frozen"]


ARENAS = """
import ctypes, json, os, sys, threading
from stack.launch.worker_cores import tune_host
print(json.dumps([tune_host(sys.argv[1], 2), len(os.sched_getaffinity(0))]), flush=True)
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
held, ready = [], threading.Barrier(8)


def first_malloc():  # a new thread takes a new arena on its first malloc while the cap allows
    held.append(libc.malloc(1 << 20))
    ready.wait()


threads = [threading.Thread(target=first_malloc) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc.malloc_stats()  # one "Arena N:" block per arena, on stderr
"""


@TWO_CORES
@pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt and malloc_stats: Linux only")
def test_a_pinned_worker_has_two_malloc_arenas_per_core_it_is_pinned_to(tmp_path):
    out = subprocess.run([sys.executable, "-c", ARENAS, str(tmp_path)], capture_output=True, text=True, check=True)
    pinned, cores = json.loads(out.stdout)
    assert pinned == share(sorted(os.sched_getaffinity(0)), 0, 2) and cores == len(pinned)
    arenas = out.stderr.count("Arena ")
    assert arenas == 2 * cores, f"{arenas} arenas for 8 threads on {cores} core(s): the cap counts the pinned cores"
