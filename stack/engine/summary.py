"""The typed result of a run: what `app` prints, a sweep's objective and tests read."""

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Summary:
    status: str  # completed | preempted | stopped_nonfinite
    first_step: int  # the first step this process ran (> 1 after a resume)
    final_step: int  # optimizer steps done when the run ended
    train: dict[str, float]  # the last logged train/* (and data/*) metrics
    eval: dict[str, float]  # the last eval/* metrics
    eval_history: tuple[tuple[int, dict[str, float]], ...]  # (step, eval/* metrics), oldest first
    perf: dict[str, float]  # perf/* of the whole run (steady state), compile_seconds, seconds
    run_dir: str
    checkpoint: str | None  # the newest step this run saved
    message: str = ""  # why the run stopped early
    signal: int | None = None

    @classmethod
    def of(cls, run: Any) -> "Summary":
        """The digest of a finished stack.engine.trainer Run."""
        evals = tuple(run.evals)
        return cls(run.status, run.first_step, run.step, dict(run.train), dict(evals[-1][1]) if evals else {},
                   evals, dict(run.perf), run.exp.run_dir, run.checkpoint, run.message, run.signal)

    @property
    def eval_at_start(self) -> dict[str, float]:
        return dict(self.eval_history[0][1]) if self.eval_history else {}

    def metrics(self) -> dict[str, float]:
        """Every scalar by name: train/*, data/*, eval/*, perf/*."""
        return {**self.train, **self.eval, **{k: v for k, v in self.perf.items() if k.startswith("perf/")}}

    def metric(self, name: str) -> float | None:
        """A metric by name (e.g. a sweep's objective `eval/loss`); None if the run has none."""
        return self.metrics().get(name)

    def best(self, name: str, mode: str = "min") -> float | None:
        """The best value an eval metric reached over the run (`mode`: min or max)."""
        values = [m[name] for _, m in self.eval_history if name in m and math.isfinite(m[name])]
        return (min if mode == "min" else max)(values) if values else None
