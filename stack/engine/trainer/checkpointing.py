"""The checkpoint hook: saves at round ends when a tier's cadence is crossed, at the last step,
and (blocking) when the run is preempted; never after a non-finite loss. Saves overlap the
next steps where `checkpoint.overlap` allows (stack.engine.trainer.save_overlap)."""

from functools import partial
from typing import Any

import jax

from stack.engine.trainer.context import PREEMPTED, RUNNING, Hook, Run
from stack.engine.trainer.nonfinite import NonFinite
from stack.engine.trainer.save_overlap import SaveThread, copy_fits, snapshot
from stack.errors import ConfigError


class Checkpointing(Hook):
    def __init__(self, checkpointer: Any, guard: NonFinite, overlap: bool | None = None):
        if overlap and jax.process_count() > 1:
            raise ConfigError(
                f"checkpoint.overlap=true with {jax.process_count()} processes: a multi-process save "
                "synchronises the processes, and from a thread those barriers would interleave with the "
                "steps' collectives in a different order on each process (a deadlock). Use "
                "checkpoint.overlap=null (the default; it does not overlap here) or false.")
        self.ckpt, self.guard, self.overlap = checkpointer, guard, overlap
        self.last = 0  # the step of the previous round end
        self.thread = SaveThread()

    def on_start(self, run: Run) -> None:
        self.last = run.step

    def tiers(self, run: Run) -> list[Any]:
        """The tiers this round end saves to: all at the end, else those whose cadence it crosses."""
        if run.done or run.status == PREEMPTED:
            return self.ckpt.tiers
        return [t for t in self.ckpt.tiers if t.every and run.step // t.every > self.last // t.every]

    def waits(self, run: Run) -> bool:
        return bool(self.tiers(run))

    def after_round(self, run: Run) -> None:
        tiers, self.last = self.tiers(run), run.step
        if not tiers or run.status not in (RUNNING, PREEMPTED) or not self.guard.check(run):
            return
        with run.clock.paused():
            self.save(run.step, run.state.saved(), run.data_state, {"wandb_id": run.exp.wandb_id}, tiers,
                      run.columns, block=run.status == PREEMPTED)
        run.checkpoint = f"{tiers[0].path}/{run.step}"

    def save(self, step: int, state: Any, data: Any, meta: dict[str, Any], tiers: list[Any], columns: Any = None,
             block: bool = False) -> None:
        """Save `state` to `tiers`: in a thread on a device copy where overlapping is allowed, else
        Orbax's async save (the caller waits for the device-to-host copy), or all of it if `block`."""
        self.thread.join()  # the previous save's errors surface here
        if block or not self._overlaps(state):
            self.ckpt.save(step, state, data, meta, tiers, block=block, columns=columns)
        else:
            self.thread.start(partial(self.ckpt.save, step, snapshot(state), data, meta, tiers, columns=columns))

    def on_end(self, run: Run) -> None:
        self.thread.close()

    def _overlaps(self, state: Any) -> bool:
        """`checkpoint.overlap`; null is decided at the first save, once the step's peak memory is known."""
        if self.overlap is None:
            several = jax.process_count() > 1
            self.overlap, why = (False, "several processes") if several else copy_fits(state)
            if not self.overlap:
                hint = "" if several else "; checkpoint.overlap=true forces overlapping"
                print(f"checkpoint.overlap=null: saves block for the device-to-host copy ({why}){hint}", flush=True)
        return self.overlap
