"""Python's cyclic garbage collector while `python -m stack` imports its libraries.

A full collection walks every live object. Once jax, flax, Hydra and the composed config are
loaded that is ~225,000 objects, and each full collection takes 0.1-0.2 s (2 cores). The tiny
SFT recipe's warm start ran five of them, ~0.55 s of GC in a 3.3 s process. The last one fell
between the loop's start and the first step (0.16-0.21 s of a 0.6 s compile window).

Imports make most of those objects and little garbage (~5,000 cyclic objects for all of
stack's imports; one Hydra compose makes ~14,000). So the entry point imports with collection
off and then freezes the heap (`gc.freeze`): later collections walk only what composition and
the job allocate. The import garbage is never freed; it is the same for every run.
"""

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_imports(module: str) -> Iterator[None]:
    """Import inside with no cyclic collection, then freeze what is alive; only on the first
    import of `module` (a sweep's later jobs in the process keep collecting as usual)."""
    if module in sys.modules or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
