"""The eval hook: the algorithm's `evaluate` over the fixed eval batches, for the starting model,
every `trainer.eval_every` steps and at the end.

The starting model's eval is not in front of the first step (its programs' compilation would
be): it runs once the first step is dispatched, on a copy of the starting state kept in host
memory (the step donates the device buffers; host memory leaves the step's device budget alone).
"""

from dataclasses import replace
from typing import Any

import jax

from stack.engine.step import TrainState
from stack.engine.trainer.context import Hook, Run
from stack.engine.trainer.metrics import window_mean


def evaluate(run: Run, state: TrainState) -> dict[str, float]:
    """Mean `eval/*` metrics of `state` (models only) over the eval batches: collect (train=False), score, evaluate."""
    programs, score = run.programs, run.exp.algorithm.score
    out = []
    for batch, host in run.eval_batches:
        if programs.interact is not None:  # multi-turn rollouts on the host, before collect
            batch = programs.interact(state, batch, host, False)
        xp = programs.collect(state, run.frozen, batch, False)
        scores = score(xp, host) if score is not None else None
        out.append(programs.evaluate(state, run.frozen, xp, scores))
    return window_mean(out, "eval/")


class HostCopy:
    """What an optimizer step donates of a state's models-only view, copied to pinned host memory.

    `rest` is left out: the update passes it through unchanged (stack.engine.step), so the current
    state's is the same. `restore` puts the copy back in the arrays' own shardings.
    """

    def __init__(self, state: TrainState):
        kept = replace(state.models_only(), rest=None)
        self.shardings = jax.tree.map(lambda x: x.sharding, kept)
        self.copy = jax.device_put(kept, jax.tree.map(lambda s: s.with_memory_kind("pinned_host"), self.shardings))

    def restore(self, current: TrainState) -> TrainState:
        return replace(jax.device_put(self.copy, self.shardings), rest=current.rest)


class Evaluation(Hook):
    def __init__(self, every: int):
        self.every = every
        self.start: HostCopy | None = None  # the starting state, until its eval after the first step

    def on_start(self, run: Run) -> None:
        """Keep the starting state for its eval after the first step (now if there is no step to run)."""
        if run.done:
            self._evaluate_start(run, run.state.models_only())
        else:
            self.start = HostCopy(run.state)

    def after_step(self, run: Run, metrics: dict[str, jax.Array], row: dict[str, Any]) -> None:
        if self.start is not None:
            start, self.start = self.start, None
            self._evaluate_start(run, start.restore(run.state))
        if run.done or (self.every and run.step % self.every == 0):
            with run.clock.paused(pending=run.state.params):
                result = evaluate(run, run.state.models_only())
            run.evals.append((run.step, result))
            row.update(result)

    @staticmethod
    def _evaluate_start(run: Run, state: TrainState) -> None:
        """The starting model's eval, logged as step 0 unless the run resumed."""
        with run.clock.paused(pending=run.state.params):
            metrics = evaluate(run, state)
        run.evals.append((run.first_step - 1, metrics))
        if run.first_step == 1:
            run.emit(0, metrics)
