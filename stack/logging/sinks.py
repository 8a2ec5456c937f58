"""Metric sinks: metrics.jsonl and the console (progress bar on a TTY, quiet otherwise)."""

import json
import math
import os
import sys
from typing import Protocol, TextIO


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


class ConsoleSink:
    """A one-line progress bar (steps, loss, tokens/s) redrawn on a TTY; eval lines always."""

    def __init__(self, total_steps: int, progress: bool = True, stream: TextIO = sys.stdout):
        self.total, self.stream = total_steps, stream
        self.bar = progress and stream.isatty()
        self._on_bar_line = False

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.bar and "train/loss" in metrics:
            width = 24
            done = int(width * step / max(self.total, 1))
            tps = metrics.get("perf/tokens_per_sec", 0.0)
            self.stream.write(
                f"\r[{'#' * done}{'.' * (width - done)}] {step}/{self.total} "
                f"loss {metrics['train/loss']:.4f} | {tps:,.0f} tok/s"
            )
            self.stream.flush()
            self._on_bar_line = True
        evals = {k: v for k, v in metrics.items() if k.startswith("eval/")}
        if evals:
            if self._on_bar_line:
                self.stream.write("\n")
                self._on_bar_line = False
            shown = " ".join(f"{k} {v:.4f}" for k, v in sorted(evals.items()))
            self.stream.write(f"step {step}: {shown}\n")
            self.stream.flush()

    def rewind(self, step: int) -> None:
        pass

    def close(self, summary: dict[str, float] | None = None) -> None:
        if self._on_bar_line:
            self.stream.write("\n")
            self.stream.flush()
