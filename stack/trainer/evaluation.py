"""The eval hook: the algorithm's `evaluate` over the fixed eval batches, at the start, every
`trainer.eval_every` steps and at the end."""

from typing import Any

import jax

from stack.trainer.context import Hook, Run
from stack.trainer.metrics import window_mean


def evaluate(run: Run) -> dict[str, float]:
    """Mean `eval/*` metrics over the eval batches: collect (train=False), score, evaluate."""
    programs, score = run.programs, run.exp.algorithm.score
    out, state = [], run.state.models_only()
    for batch, host in run.eval_batches:
        xp = programs.collect(state, run.frozen, batch, False)
        scores = score(xp, host) if score is not None else None
        out.append(programs.evaluate(state, run.frozen, xp, scores))
    return window_mean(out, "eval/")


class Evaluation(Hook):
    def __init__(self, every: int):
        self.every = every

    def on_start(self, run: Run) -> None:
        """Evaluate the starting model (logged as step 0 unless the run resumed)."""
        with run.clock.paused():
            metrics = evaluate(run)
        run.evals.append((run.step, metrics))
        if run.step == 0:
            run.emit(0, metrics)

    def after_step(self, run: Run, metrics: dict[str, jax.Array], row: dict[str, Any]) -> None:
        if run.done or (self.every and run.step % self.every == 0):
            with run.clock.paused(pending=run.state.params):
                result = evaluate(run)
            run.evals.append((run.step, result))
            row.update(result)
