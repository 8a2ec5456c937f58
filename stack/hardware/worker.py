"""A spawned host process that calls one function at a time: what runs user code beside training
(reward functions, stack.rewards.runner; environments, stack.rewards.env_runner), so a hang or a
crash in it costs an answer, never the run. stack.hardware imports nothing on its own: a worker
starts without jax."""

import multiprocessing
import time
from typing import Any

from stack.errors import RunFailed


def _serve(conn: Any) -> None:
    """Worker loop: ("started", None) once, then (function, kwargs) in, ("ok", values) or ("error", message) out."""
    conn.send(("started", None))
    while True:
        try:
            fn, kwargs = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", list(fn(**kwargs))))
        except Exception as exc:  # the function's own failure: reported, the worker lives on
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class Worker:
    """A spawned process that calls one function at a time."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.proc.start()
        self.started = False

    def answer(self, timeout: float) -> tuple[str, Any]:
        """The next answer, past the start-up message: TimeoutError after `timeout` seconds,
        EOFError or OSError if the process died."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.conn.poll(max(deadline - time.monotonic(), 0.0)):
                raise TimeoutError
            message = self.conn.recv()
            if message[0] != "started":
                return message
            self.started = True

    def reply(self, timeout: float, who: str, key: str) -> tuple[str, Any]:
        """The next answer, or ("lost", why) when none came within `timeout` seconds (`key`: the setting)
        or the process died; a lost worker is closed. RunFailed when it died before it started (`who`:
        what runs in it): a spawned process imports the main module first."""
        try:
            return self.answer(timeout)
        except TimeoutError:
            self.close()
            return "lost", f"no answer within {key}={timeout}s"
        except (EOFError, OSError):
            self.close()
            if not self.started:
                raise RunFailed(
                    f"the worker process of {who} exited with code {self.proc.exitcode} before it started (its "
                    "own error is printed above). It runs in a spawned process, which imports the main module "
                    'first: a script that runs training must do so under `if __name__ == "__main__":`.') from None
            return "lost", f"its worker process died, exit code {self.proc.exitcode}"

    def close(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()
