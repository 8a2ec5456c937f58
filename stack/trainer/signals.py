"""SIGTERM / SIGINT become a request to stop at the end of the current round (after a save)."""

import signal
import threading
from typing import Any

from stack.trainer.context import PREEMPTED, RUNNING, Hook, Run


class Signals(Hook):
    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def on_start(self, run: Run) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)

    def after_round(self, run: Run) -> None:
        if self.signum is not None and run.status == RUNNING:
            run.status, run.signal = PREEMPTED, self.signum
            run.message = f"preempted by signal {self.signum} after step {run.step}"

    def on_end(self, run: Run) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old = {}
