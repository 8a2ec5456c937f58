"""SIGTERM / SIGINT become a request to stop at the end of the current round (after a save).

In a run of several processes every process must stop at the same round: one that stopped alone
would wait in the save's barrier while the others wait for it in the next step's collectives.
There SIGTERM is left to `jax.distributed`'s preemption notifier, SIGINT is re-sent to this
process as SIGTERM, and each process calls `multihost_utils.reached_preemption_sync_point` at
every round end; it turns true on all of them at the same round, once any one was signalled
(the round after the latest one any process had reached). This is the protocol Orbax's
`CheckpointManager.reached_preemption` uses.
"""

import os
import signal
import threading
from typing import Any

import jax
from jax.experimental import multihost_utils

from stack.engine.trainer.context import PREEMPTED, RUNNING, Hook, Run


class Signals(Hook):
    def __init__(self) -> None:
        self.signum: int | None = None
        self.rounds = 0  # round ends seen: the sync point's step id (the same count on every process)
        self.several = False
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def _to_notifier(self, signum: int, frame: Any) -> None:
        """Several processes: remember SIGINT (the exit code), pass it on as jax's preemption notice."""
        self.signum = signum
        os.kill(os.getpid(), signal.SIGTERM)

    def on_start(self, run: Run) -> None:
        self.several, self.rounds = jax.process_count() > 1, 0
        if threading.current_thread() is threading.main_thread():
            handlers = ({signal.SIGINT: self._to_notifier} if self.several
                        else {signal.SIGTERM: self._handle, signal.SIGINT: self._handle})
            for sig, handler in handlers.items():
                self._old[sig] = signal.signal(sig, handler)

    def waits(self, run: Run) -> bool:
        """A signal received: this round end stops the run (and saves), so its held rows go out
        first. With several processes the stop is decided at the sync point, after this check,
        and SIGTERM goes to jax's notifier: there the rows still held (the newest logging step's,
        `Sync(fixed=log_every)`) go out after the save."""
        return self.signum is not None

    def after_round(self, run: Run) -> None:
        if self.several:
            stop, signum = multihost_utils.reached_preemption_sync_point(self.rounds), self.signum or signal.SIGTERM
            self.rounds += 1
        else:
            stop, signum = self.signum is not None, self.signum
        if stop and run.status == RUNNING:
            run.status, run.signal = PREEMPTED, signum
            run.message = f"preempted by signal {signum} after step {run.step}"

    def on_end(self, run: Run) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old = {}
