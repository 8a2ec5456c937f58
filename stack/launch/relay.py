"""Rank 0's output under `launcher=local`, on this console without the line Gloo (jax's CPU
collectives) prints in each process at its first collective (`[Gloo] Rank 0 is connected to 1 peer
ranks. ...`). The rank writes into a pseudo-terminal when the console is one (so its progress bar
still draws), else a pipe; a small process of its own (`python -m stack.launch.relay FD`) copies
the rest to the console as it comes, a progress bar's partial lines included. It ignores Ctrl-C
and SIGTERM and ends when the rank's output does, so a rank that saves after its launcher died
(SIGKILL) still has somewhere to write.
"""

import os
import pty
import re
import signal
import subprocess
import sys

GLOO = b"[Gloo] "
GLOO_LINE = re.compile(rb"\[Gloo\] [^\n]*\n")


def relay(console: int) -> tuple[int, subprocess.Popen]:
    """(the fd for the rank's stdout, the relay process writing to fd `console`); the caller closes
    the returned fd once the rank has it, and waits for the process after the rank ends."""
    read, write = pty.openpty() if os.isatty(console) else os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "stack.launch.relay", str(read)], pass_fds=(read,),
                            stdin=subprocess.DEVNULL, stdout=console)
    os.close(read)
    return write, proc


def _maybe_gloo(text: bytes) -> bool:
    """Whether `text` may still become (or already is) the start of a Gloo line."""
    return GLOO.startswith(text) if len(text) < len(GLOO) else text.startswith(GLOO)


def split(data: bytes) -> tuple[bytes, bytes]:
    """(what can be written now, what must wait for more): every whole Gloo line removed, wherever
    it fell (a pipe's writer may flush half a line before Gloo's); a possible Gloo start held."""
    cut = data.rfind(b"\n") + 1
    body, tail = GLOO_LINE.sub(b"", data[:cut]), data[cut:]
    hold = next((i for i in range(len(tail)) if tail[i:i + 1] == b"[" and _maybe_gloo(tail[i:])), len(tail))
    return body + tail[:hold], tail[hold:]


def copy(read: int, dest: int) -> None:
    """Everything from fd `read` to fd `dest` until its end, without Gloo's lines."""
    pending = b""
    while True:
        try:
            chunk = os.read(read, 65536)
        except OSError:  # a pseudo-terminal's EIO once every writer has closed it
            chunk = b""
        if not chunk:
            break
        out, pending = split(pending + chunk)
        _write(dest, out)
    _write(dest, b"" if _maybe_gloo(pending) else pending)


def _write(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the ranks stop on these; their last lines still come
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    copy(int(sys.argv[1]), sys.stdout.fileno())
