"""The processes a `python -m stack` process started, ended with it.

A sweep's joblib (loky) workers and resource trackers, reward workers and other helpers are
children of the main process. When it ends on Ctrl-C it exits at once (`os._exit`, see
stack.cli.app.main), and nothing would end them: loky's workers went on training their jobs as
orphans. `end_descendants` sends SIGTERM to every descendant (a training job
saves at the end of its round, as on preemption), then SIGKILL to those left after a grace time.
Meanwhile a worker whose job ended would take the sweep's next one: the main process first creates
the file `STACK_SWEEP_STOP` names (its workers inherit the variable), and a job starts only while
that file does not exist (`sweep_stopped`).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time

STOP = "STACK_SWEEP_STOP"


def descendants(pid: int) -> list[int]:
    """The live processes below `pid`, read from /proc (none where there is no /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])  # after the command, which may hold spaces
        except (OSError, IndexError, ValueError):  # it exited meanwhile
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


class Stopped(KeyboardInterrupt):
    """A sweep's job in its main process (Hydra's basic launcher) saved after SIGTERM: the sweep
    ends as on Ctrl-C, with that signal's exit code."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def interrupted(signum: int = signal.SIGINT, frame: object = None) -> None:
    """Ctrl-C outside the training loop (the SIGINT handler of `python -m stack`, and a sweep's
    SIGTERM handler): one line, this process's descendants ended, exit 128 + the signal at once (no
    interpreter teardown: XLA threads cut short by Ctrl-C can crash it; a KeyboardInterrupt raised
    while Python runs a gc callback, which jax has, is swallowed as 'Exception ignored', and the
    run would go on)."""
    print("interrupted (Ctrl-C)" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    end_descendants()
    os._exit(128 + signum)


def own_stop_file() -> None:
    """In the main process of a sweep, before it starts workers: name the file that stops them."""
    os.environ[STOP] = os.path.join(tempfile.gettempdir(), f"stack-sweep-{os.getpid()}.stop")


def sweep_main() -> bool:
    """Whether this process is the main process of a sweep (it named the stop file)."""
    return os.environ.get(STOP, "").endswith(f"-{os.getpid()}.stop")


def sweep_stopped() -> bool:
    """Whether the sweep this process works for has ended (its main process was interrupted)."""
    path = os.environ.get(STOP)
    return bool(path) and os.path.exists(path)


def end_descendants(grace: float = 6.0) -> None:
    """SIGTERM every descendant of this process, SIGKILL the ones still alive after `grace` s
    (a sweep's workers start no job meanwhile: `sweep_stopped`)."""
    stop, mine = os.environ.get(STOP, ""), sweep_main()
    if mine:
        open(stop, "w").close()
    try:
        procs = descendants(os.getpid())
        for pid in procs:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while procs and time.monotonic() < deadline:
            time.sleep(0.1)
            procs = [p for p in procs if _alive(p)]
        for pid in procs:
            _signal(pid, signal.SIGKILL)
    finally:
        if mine:
            os.remove(stop)


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
