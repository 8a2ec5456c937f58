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

import threading
from collections.abc import Callable
from typing import Any

import jax

from stack.parallel import bytes_per_device

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
    """At most one save in flight; its exception is raised by the next `join`."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, save: Callable[[], None]) -> None:
        self.join()
        self._thread = threading.Thread(target=self._run, args=(save,), name="stack-checkpoint-save")
        self._thread.start()

    def _run(self, save: Callable[[], None]) -> None:
        try:
            save()
        except BaseException as exc:  # raised in the loop's thread by join()
            self._error = exc

    def join(self) -> None:
        """Wait for the save in flight; raise its error, if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
