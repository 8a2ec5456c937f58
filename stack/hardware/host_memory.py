"""Keep freed host memory in the process on CPU runs, so that a step does not page-fault its
buffers in afresh every time.

XLA:CPU allocates a step's outputs and temporaries with malloc. glibc serves large blocks with
mmap, returns them (and a heap's free top past 128 KiB) to the OS on free, and gives threads
their own arenas whose 64 MiB heaps it unmaps when they empty; so the next step touches fresh
pages, and a small step spends much of its wall time in the kernel. High mmap and trim
thresholds (`mallopt`, the knobs behind MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_) keep
those pages for reuse, as TCMalloc or PyTorch's caching allocator do.
A thread arena whose first heap is full grows a second one, and glibc deletes a secondary heap as
soon as it empties, whatever the trim threshold, unless the heap before it has room for the top
pad: a 64 MiB top pad (M_TOP_PAD, MALLOC_TOP_PAD_) keeps it. Without it, a sweep worker's XLA
dispatch thread, sharing an arena with long-lived data, mapped and unmapped a heap every step.
Arenas are capped at two per core (MALLOC_ARENA_MAX): XLA's pool threads, the loop and the data
threads allocate at once. One arena serialised them on its lock; glibc's default of eight per
core left the data thread faulting its pages in again. The cost: a block over 64 MiB that a pool
thread allocates comes from mmap and faults in each time (a thread arena's heap is 64 MiB at
most; one arena kept it).
Numerics are untouched. Call it before jax starts its threads (an arena is bound to a thread at
its first malloc). Elsewhere (musl, macOS) it is a no-op.
"""

import ctypes
import os
import platform

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8  # glibc malloc.h
KEEP_BYTES = 1 << 30  # blocks below 1 GiB come from the heap; up to 1 GiB of free top is kept
TOP_PAD_BYTES = 64 << 20  # a thread arena's heap size (HEAP_MAX_SIZE): an emptied secondary heap stays


def keep_freed_host_memory() -> bool:
    """Two malloc arenas per core, mmap and trim thresholds at KEEP_BYTES, a top pad of TOP_PAD_BYTES;
    whether glibc took them all."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    arenas = 2 * len(os.sched_getaffinity(0))
    settings = ((M_ARENA_MAX, arenas), (M_MMAP_THRESHOLD, KEEP_BYTES), (M_TRIM_THRESHOLD, KEEP_BYTES),
                (M_TOP_PAD, TOP_PAD_BYTES))
    return all([mallopt(option, value) for option, value in settings])
