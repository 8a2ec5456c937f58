"""Rank 0's output under `launcher=local`, on this console without the line Gloo (jax's CPU
collectives) prints in each process at its first collective (`[Gloo] Rank 0 is connected to 1 peer
ranks. ...`). The rank writes into a pseudo-terminal when the console is one (so its progress bar
still draws), else a pipe; a thread copies the rest through as it comes, a progress bar's partial
lines included."""

import os
import pty
import re
import threading

GLOO = b"[Gloo] "
GLOO_LINE = re.compile(rb"\[Gloo\] [^\n]*\n")


def relay(dest: int) -> tuple[int, threading.Thread]:
    """(the fd for the rank's stdout, the thread copying what it writes to fd `dest`); the caller
    closes the returned fd once the rank has it, and joins the thread after the rank ends."""
    read, write = pty.openpty() if os.isatty(dest) else os.pipe()
    thread = threading.Thread(target=_copy, args=(read, dest), daemon=True)
    thread.start()
    return write, thread


def _maybe_gloo(text: bytes) -> bool:
    """Whether `text` may still become (or already is) the start of a Gloo line."""
    return GLOO.startswith(text) if len(text) < len(GLOO) else text.startswith(GLOO)


def _split(data: bytes) -> tuple[bytes, bytes]:
    """(what can be written now, what must wait for more): every whole Gloo line removed, wherever
    it fell (a pipe's writer may flush half a line before Gloo's); a possible Gloo start held."""
    cut = data.rfind(b"\n") + 1
    body, tail = GLOO_LINE.sub(b"", data[:cut]), data[cut:]
    hold = next((i for i in range(len(tail)) if tail[i:i + 1] == b"[" and _maybe_gloo(tail[i:])), len(tail))
    return body + tail[:hold], tail[hold:]


def _copy(read: int, dest: int) -> None:
    pending = b""
    while True:
        try:
            chunk = os.read(read, 65536)
        except OSError:  # a pseudo-terminal's EIO once every writer has closed it
            chunk = b""
        if not chunk:
            break
        out, pending = _split(pending + chunk)
        _write(dest, out)
    _write(dest, b"" if _maybe_gloo(pending) else pending)
    os.close(read)


def _write(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]
