"""Python's cyclic garbage collector while `python -m stack` imports its libraries.

A full collection walks every live object. Once jax, flax, Hydra and the composed config are
loaded those are hundreds of thousands, and each full collection takes a sizeable share of a
small run's start; one can fall between the loop's start and the first step.

Imports make most of those objects and little garbage (less than one Hydra compose makes). So
the entry point imports with collection off and then freezes the heap (`gc.freeze`): later
collections walk only what composition and the job allocate. The import garbage is never freed;
it is the same for every run.
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
