"""NaN policy (`trainer.nan_policy`): `stop` ends the run at the first non-finite train loss
seen when logged rows are completed or before a checkpoint save, so no bad state is ever written.
Rows are completed at the loop's waits for the device (stack.engine.trainer.sync: ~0.2 s of steps apart),
so the run stops at the end of the round running then, a few steps after the bad one; a wait at
a round's start (rounds of several steps or scored on the host) stops before that round."""

import math
from typing import Any

import jax

from stack.engine.trainer.context import NONFINITE, RUNNING, Hook, Run
from stack.engine.trainer.metrics import to_host


class NonFinite(Hook):
    def __init__(self, policy: str):
        self.policy = policy
        self.unchecked: list[tuple[int, jax.Array]] = []  # (step, loss) since the last check

    def after_step(self, run: Run, metrics: dict[str, jax.Array], row: dict[str, Any]) -> None:
        if self.policy != "stop":
            return
        self.unchecked.append((run.step, metrics["loss"]))

    def log(self, run: Run, rows: list[tuple[dict[str, Any], Any]]) -> None:
        self.check(run)  # every loss up to the rows' steps is on the host now

    def check(self, run: Run) -> bool:
        """True when every loss since the last check is finite; else stop the run (policy stop)."""
        losses, self.unchecked = to_host(self.unchecked), []
        bad = next(((step, float(loss)) for step, loss in losses if not math.isfinite(float(loss))), None)
        if bad is None or self.policy != "stop":
            return True
        if run.status == RUNNING:
            run.status = NONFINITE
            where = f"the last good checkpoint is {run.checkpoint}" if run.checkpoint else "no checkpoint was saved"
            run.message = (f"train/loss is non-finite ({bad[1]}) at step {bad[0]}; stopped without saving "
                           f"(trainer.nan_policy=stop); {where}. Lower optimizer.lr, clip gradients "
                           "(optimizer.clip_norm) or check the data.")
        return False
