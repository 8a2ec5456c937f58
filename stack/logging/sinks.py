"""The sink protocol, and metrics.jsonl (the console, TensorBoard and wandb sinks: their own modules)."""

import json
import math
import os
from typing import Protocol


class Sink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def rewind(self, step: int) -> None:
        """A run continues after `step` (-1: it starts over): forget what was logged after it."""
        ...

    def close(self, summary: dict[str, float] | None = None) -> None:
        """Flush and release; `summary`: the run's final metrics by name (Summary.metrics())."""
        ...


class JsonlSink:
    """One JSON object per logged step, `{"step": N, "train/loss": ...}`, flushed each write."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self._f = open(self.path, "a")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()}
        self._f.write(json.dumps({"step": step, **clean}) + "\n")
        self._f.flush()

    def rewind(self, step: int) -> None:
        """Drop rows after `step` (logged by a killed run after its last checkpoint; -1: every row)."""
        self._f.close()
        with open(self.path) as f:
            keep = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
        with open(self.path, "w") as f:
            f.writelines(keep)
        self._f = open(self.path, "a")

    def close(self, summary: dict[str, float] | None = None) -> None:
        self._f.close()
