"""`trainer.profile=[START,STOP]`: a `jax.profiler` trace of optimizer steps START..STOP (inclusive)
written under `<run_dir>/profile` (TensorBoard's profile plugin or Perfetto read it).

The trace starts once step START-1 has returned (at the start for START=1), so when START opens
a round, the round's collect (a rollout, a reference forward) is in it too; it stops once step
STOP's results are ready, so all of its device work is traced. Checked by stack.config.validate."""

import os

import jax

from stack.engine.trainer.context import Hook, Run


class Profiler(Hook):
    """Traces steps `start`..`stop` into `trace_dir` (steps before a resume point are not run)."""

    def __init__(self, start: int, stop: int, trace_dir: str):
        self.start, self.stop, self.trace_dir = start, stop, trace_dir
        self.active = False

    def on_start(self, run: Run) -> None:
        self._maybe_start(run)

    def after_step(self, run: Run, metrics: dict[str, jax.Array], row: dict[str, float]) -> None:
        if self.active and run.step >= self.stop:
            self._stop(run)
        self._maybe_start(run)

    def on_end(self, run: Run) -> None:
        if self.active:
            self._stop(run)

    def _maybe_start(self, run: Run) -> None:
        if not self.active and self.start <= run.step + 1 <= self.stop:
            os.makedirs(self.trace_dir, exist_ok=True)
            jax.profiler.start_trace(self.trace_dir)
            self.active = True
            print(f"profiling steps {run.step + 1}..{self.stop} into {self.trace_dir}", flush=True)

    def _stop(self, run: Run) -> None:
        jax.block_until_ready(run.state.params)
        jax.profiler.stop_trace()
        self.active = False
