"""The checkpoint hook: saves at round ends when a tier's cadence is crossed, at the last step,
and (blocking) when the run is preempted; never after a non-finite loss."""

from typing import Any

from stack.trainer.context import PREEMPTED, RUNNING, Hook, Run
from stack.trainer.nonfinite import NonFinite


class Checkpointing(Hook):
    def __init__(self, checkpointer: Any, guard: NonFinite):
        self.ckpt, self.guard = checkpointer, guard
        self.last = 0  # the step of the previous round end

    def on_start(self, run: Run) -> None:
        self.last = run.step

    def after_round(self, run: Run) -> None:
        previous, self.last = self.last, run.step
        final = run.done or run.status == PREEMPTED
        tiers = self.ckpt.tiers if final else [t for t in self.ckpt.tiers
                                               if t.every and run.step // t.every > previous // t.every]
        if not tiers or run.status not in (RUNNING, PREEMPTED) or not self.guard.check(run):
            return
        with run.clock.paused():
            meta = {"wandb_id": run.exp.wandb_id}
            self.ckpt.save(run.step, run.state.saved(), run.data_state, meta, tiers,
                           block=run.status == PREEMPTED, columns=run.columns)
        run.checkpoint = f"{tiers[0].path}/{run.step}"
