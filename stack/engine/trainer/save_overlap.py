"""Overlapped checkpoint saves: the loop hands a save to a background thread and goes on.

Orbax's async save still blocks its caller for the device-to-host copy of the state. Here the
state is first copied on device (`jax.device_put(..., may_alias=False)`, dispatched without
waiting), because the next step donates the live buffers; a thread then runs the Orbax save of
that copy, so the transfer overlaps the next steps instead of stalling the loop. Atomicity is
Orbax's: the step directory is committed only once every file is written.

The price is one more copy of the state in device memory until the transfer is done, so
`checkpoint.overlap` null (the default) overlaps only when that copy fits in what the device
has free after the step's peak (always on a CPU backend, whose "device" memory is host RAM);
true always; false never. Never with several processes: a multi-process save synchronises them,
and from a thread those barriers interleave with the steps' collectives in a different order on
each process (a 2-process run hung at its first save).
"""

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax

from stack.hardware.mesh import bytes_per_device

MiB = 2**20


def snapshot(tree: Any) -> Any:
    """A copy of every jax.Array leaf of `tree` in new device buffers, same shardings (async)."""
    leaves, treedef = jax.tree.flatten(tree)
    at = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
    copies = jax.device_put([leaves[i] for i in at], [leaves[i].sharding for i in at], may_alias=False)
    for i, copy in zip(at, copies, strict=True):
        leaves[i] = copy
    return jax.tree.unflatten(treedef, leaves)


def copy_fits(tree: Any, stats: dict[str, int] | None = None) -> tuple[bool, str]:
    """Whether a second copy of `tree` fits in the device's free memory after its peak so far,
    and why. `stats`: `Device.memory_stats()` (default: the first local device's; None, as on
    CPU: host RAM, it fits)."""
    stats = stats or jax.local_devices()[0].memory_stats()
    if not stats or "bytes_limit" not in stats:
        return True, "the backend reports no device memory limit"
    need = bytes_per_device(tree)
    free = stats["bytes_limit"] - stats.get("peak_bytes_in_use", stats.get("bytes_in_use", 0))
    return need <= free, f"a copy of the state needs {need / MiB:,.0f} MiB per device, {free / MiB:,.0f} MiB are free"


class SaveThread:
    """At most one save in flight, on one worker thread kept until `close` (handing a save to it
    costs the loop a queue put, not a thread start that then waits for the GIL); its exception
    is raised by the next `join`."""

    def __init__(self) -> None:
        self._worker: ThreadPoolExecutor | None = None
        self._pending: Future | None = None

    def start(self, save: Callable[[], None]) -> None:
        self.join()
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stack-checkpoint-save")
        self._pending = self._worker.submit(save)

    def join(self) -> None:
        """Wait for the save in flight; raise its error, if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Wait for the save in flight (raising its error), then end the worker thread."""
        try:
            self.join()
        finally:
            if self._worker is not None:
                self._worker.shutdown(wait=True)
                self._worker = None
