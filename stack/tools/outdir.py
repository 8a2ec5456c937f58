"""A tool's output directory (`--out`): never overwritten unless asked, never left half written.

The tool writes into a temporary directory beside `--out` and renames it to `--out` when it is
done, so an interrupted export or quantization (Ctrl-C, kill -9, a full disk) leaves nothing
under the final name (at most a hidden `.NAME.partial-*` beside it). An existing `--out` that is
not empty is refused unless `--overwrite`; then it is replaced only once the new one is complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from stack.errors import ConfigError


def check_out(out: str, overwrite: bool, flag: str = "--out") -> None:
    """ConfigError for an output dir (`flag`) that is a file, or a non-empty directory without `overwrite`."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"{flag} {out!r} is a file; give a directory (nothing was written).")
    if os.path.isdir(out) and os.listdir(out) and not overwrite:
        raise ConfigError(f"{flag} {out!r} already exists and is not empty; pick a new directory or pass --overwrite "
                          "to replace it once the new output is complete (nothing was written).")


@contextlib.contextmanager
def fresh_dir(out: str, overwrite: bool = False) -> Iterator[str]:
    """A temporary directory to write into; it becomes `out` when the block ends without an error."""
    out = os.path.abspath(out)
    check_out(out, overwrite)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.partial-", dir=parent)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not os.path.exists(out):
        os.rename(tmp, out)
        return
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=parent)
    os.rename(out, os.path.join(old, "out"))
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
