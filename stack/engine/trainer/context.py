"""What the trainer and its hooks share: the run's mutable record, a clock, the hook interface."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import jax

from stack.engine.experiment import Experiment
from stack.engine.step import Programs, TrainState

RUNNING, COMPLETED, PREEMPTED, NONFINITE = "running", "completed", "preempted", "stopped_nonfinite"


class Clock:
    """Wall time minus the paused spans (eval, logging, checkpoint saves): step time only."""

    def __init__(self) -> None:
        self._paused = 0.0

    def now(self) -> float:
        return time.perf_counter() - self._paused

    @contextmanager
    def paused(self, pending: Any = None) -> Iterator[None]:
        """Pause while the block runs; first wait for `pending` (queued steps count as step time)."""
        if pending is not None:
            jax.block_until_ready(pending)
        start = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - start


@dataclass
class Run:
    """The record of one run: hooks read it, and write the fields named for them."""

    exp: Experiment
    programs: Programs
    state: TrainState
    frozen: Any  # the frozen modules' state (None: none, or dropped after precomputing)
    eval_batches: list[tuple[dict[str, jax.Array], dict[str, Any]]]  # (device, host) per eval batch
    first_step: int  # the first optimizer step this process runs (> 1 after a resume)
    total_steps: int  # trainer.steps (read once: config access costs ~0.1 ms, per step that shows)
    step: int = 0  # optimizer steps done
    data_state: Any = None  # the data iterator's state after the current round's batches
    columns: Any = None  # precomputed per-record tables (saved with the data state)
    status: str = RUNNING
    message: str = ""  # why the run stopped early
    signal: int | None = None
    clock: Clock = field(default_factory=Clock)
    tokens_per_step: int = 0
    episodes_per_step: float = 0.0  # sampled completions per optimizer step (on-policy rounds; eps)
    train: dict[str, float] = field(default_factory=dict)  # the last logged train metrics
    evals: list[tuple[int, dict[str, float]]] = field(default_factory=list)  # (step, eval metrics)
    synced: int = 0  # the newest step the device is known to have finished (the loop's last wait)
    checkpoint: str | None = None  # the newest step this run saved
    # whole-run throughput (Throughput), precompile_seconds, peak_flops_per_device (PeakProbe)
    perf: dict[str, float] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.step >= self.total_steps

    def emit(self, step: int, row: dict[str, float]) -> None:
        """Send a logged row to every sink (paused: logging is not step time)."""
        with self.clock.paused():
            for sink in self.exp.sinks:
                sink.log(step, row)


class Hook:
    """A side concern of the loop. Hooks read the run and add to the logged row; they never
    change the math. Every method is optional."""

    def on_start(self, run: Run) -> None:
        """Before the first round (state restored or initialised)."""

    def after_step(self, run: Run, metrics: dict[str, jax.Array], row: dict[str, float]) -> None:
        """After each optimizer step, without waiting for it: `metrics` on device; add what to log
        at this step to `row` (eval does, and waits)."""

    def take(self, run: Run) -> Any:
        """At a logging step, without waiting: what `log` will need for this step's row (e.g. the
        window of device metrics since the last logging step)."""

    def log(self, run: Run, rows: list[tuple[dict[str, float], Any]]) -> None:
        """At the loop's next wait for the device (stack.engine.trainer.sync), every held logging step's
        (row, what `take` returned), oldest first: fetch the values and add them to each row.
        `run.synced` is the newest step the device has finished; later ones may be queued."""

    def waits(self, run: Run) -> bool:
        """Whether this round end needs the device done and the held rows emitted before
        `after_round` (a checkpoint save: a saved step's rows reach the sinks before it does)."""
        return False

    def after_round(self, run: Run) -> None:
        """After the round's last step (rounds are where checkpoints and stops fall)."""

    def on_end(self, run: Run) -> None:
        """When the run ends, however it ends."""
