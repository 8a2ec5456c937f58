"""Failed checkpoint saves: one paragraph (which step, where, the OS error, what still
restores) instead of Orbax/TensorStore tracebacks. Orbax never commits a half-written step, so
the previous one restores on the rerun. A checkpoint of an older layout: refused, one paragraph."""

import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from stack.errors import ConfigError, RunFailed, short


@contextmanager
def writing(tier: Any, step: int | None) -> Iterator[None]:
    """A failed (possibly async) save of `step` becomes one paragraph: which step, where, the OS
    error, and what still restores. Orbax never commits the half-written step."""
    try:
        yield
    except Exception as exc:
        quiet_failed_reads()  # the save's other writes die later, each reported at exit
        saved = [s for s in tier.manager.all_steps() if s != step]
        left = f"step {max(saved)} there still restores" if saved else "no earlier step was saved there"
        raise RunFailed(
            f"checkpoint step {step} could not be written to {tier.path}/{step}: {_os_error(exc)}. The run "
            f"stopped; {left}. Free space (or point checkpoint.path elsewhere) and rerun the same command to "
            "resume.") from exc


def aborted_write(unraisable: Any) -> None:
    """sys.unraisablehook: when a save fails, TensorStore completes its other in-flight writes into
    Orbax's closed event loop, one 'Event loop is closed' traceback each (hundreds, while the
    loop goes on); when a step cannot be read, each of Orbax's other array reads dies at exit
    with a TensorStore spec as its message (a 60-line traceback each). Those alone are dropped:
    `writing` reports the failed save, `Checkpointer.restore` each unreadable step."""
    closed = isinstance(unraisable.exc_value, RuntimeError) and "Event loop is closed" in str(unraisable.exc_value)
    code = getattr(unraisable.object, "cr_code", None)  # a coroutine that was never awaited to the end
    orbax_read = code is not None and "/orbax/" in code.co_filename
    if not (closed or orbax_read):
        sys.__unraisablehook__(unraisable)


def _os_error(exc: Exception) -> str:
    """The OS error of a failed save ("File too large (errno 27)"): the errno of a TensorStore/Orbax
    message (its `[os_error_code=N]` annotation; the text before it may be another annotation, a
    spec) or of an OSError, in `exc` or the exceptions it was raised from; else `exc`'s last line."""
    seen: BaseException | None = exc
    while seen is not None:
        found = re.search(r"\[os_error_code='?(\d+)", str(seen))
        if found:
            return f"{os.strerror(int(found.group(1)))} (errno {found.group(1)})"
        if isinstance(seen, OSError) and seen.errno:
            return f"{seen.strerror} (errno {seen.errno})"
        seen = seen.__cause__ or seen.__context__
    text = str(exc).strip()
    return short((text.splitlines() or [type(exc).__name__])[-1], 300)


def quiet_failed_reads() -> None:
    """After a read or write that failed: Orbax's other reads or writes of the step die later, each
    reported with a traceback at exit (an unraisable coroutine, or asyncio's 'Task exception was
    never retrieved'); the one paragraph already says it (run.log has Orbax's own account), so
    those are dropped."""
    sys.unraisablehook = aborted_write
    logging.getLogger("asyncio").addFilter(lambda r: "exception was never retrieved" not in r.getMessage())
    warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)


def unreadable_step(path: str, step: int, steps: list[int], exc: Exception) -> ConfigError:
    """A checkpoint step that cannot be read (damaged, truncated): which, why, and the other steps."""
    why = short(" ".join(str(exc).strip().splitlines()[-1:] or [type(exc).__name__]), 240)
    others = [s for s in steps if s != step]
    where = (f"other steps there: {', '.join(map(str, others))} (--step N, or checkpoint.resume=DIR/N)" if others
             else "no other step is there")
    return ConfigError(f"Checkpoint step {step} of {path!r} cannot be read, its files are damaged or incomplete "
                       f"({why}); {where}.")


def check_format(meta: dict[str, Any], where: str, expected: int) -> None:
    """Refuse a checkpoint whose state layout this version cannot read."""
    found = meta.get("format", 1)
    if found != expected:
        raise ConfigError(
            f"Checkpoint {where} has format {found} (params and an optax.MultiSteps optimizer state, "
            f"written before the trainer redesign); this version resumes format {expected} only (a TrainState "
            "with step, PRNG key and algorithm state; gradient accumulation inside the step), so its "
            "optimizer state cannot be read. Start a new run dir (model.init_from=<that checkpoints dir> "
            "still loads its params), or finish that run with the stack version that wrote it.")
