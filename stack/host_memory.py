"""Keep freed host memory in the process on CPU runs, so that a step does not page-fault its
buffers in afresh every time.

XLA:CPU allocates a step's outputs and temporaries with malloc. glibc serves large blocks with
mmap, returns them (and a heap's free top past 128 KiB) to the OS on free, and gives threads
their own arenas whose 64 MiB heaps it unmaps when they empty; so the next step touches fresh
pages: on the tiny recipe ~11,000 minor page faults per step, a third of its wall time spent in
the kernel. One arena with high mmap and trim thresholds (`mallopt`, the knobs behind
MALLOC_ARENA_MAX / MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_) keeps those pages for reuse,
as TCMalloc or PyTorch's caching allocator do. Numerics are untouched. Call it before jax starts
its threads (an arena is bound to a thread at its first malloc). Elsewhere (musl, macOS) it is a
no-op.
"""

import ctypes
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc malloc.h
KEEP_BYTES = 1 << 30  # blocks below 1 GiB come from the heap; up to 1 GiB of free top is kept


def keep_freed_host_memory() -> bool:
    """One malloc arena, mmap and trim thresholds at KEEP_BYTES; whether glibc took them all."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    return all([mallopt(M_ARENA_MAX, 1), mallopt(M_MMAP_THRESHOLD, KEEP_BYTES), mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)])
