"""The console sink: a tqdm bar (ETA, loss, tokens/s) on a terminal or in a notebook; off both,
a progress row every `logger.progress_interval` seconds. Eval rows always, grouped by prefix."""

import io
import os
import sys
import time
from typing import Any, TextIO

from tqdm.std import tqdm as plain_tqdm

from stack.logging.rows import row_lines


def in_notebook() -> bool:
    """Whether this process is a Jupyter/Colab kernel (the test tqdm.autonotebook makes)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and "IPKernelApp" in shell.config


def progress_bar(total: int, start: int, postfix: str, stream: TextIO) -> Any:
    """tqdm's bar: the notebook widget in a kernel (tqdm.auto), the text bar on a terminal."""
    if in_notebook():
        from tqdm.auto import tqdm  # tqdm.auto asks IPython which bar fits: only in a kernel

        return tqdm(total=total, initial=start, unit="step", postfix=postfix)
    columns, lines = terminal_size(stream)  # a pty nobody sized (launcher=local's relay, `script`): 0 x 0
    sized = columns > 0 and lines > 0
    return plain_tqdm(total=total, initial=start, unit="step", postfix=postfix, file=stream, dynamic_ncols=sized,
                      ncols=None if sized else columns or 100, nrows=None if sized else 20)


def terminal_size(stream: TextIO) -> tuple[int, int]:
    """(columns, lines) of the terminal `stream` writes to; (0, 0): none. tqdm draws nothing in a
    terminal of 0 lines, and some ptys report their columns only."""
    try:
        return tuple(os.get_terminal_size(stream.fileno()))
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return 0, 0


class ConsoleSink:
    """`progress`: the bar, or off a terminal progress rows at most every `interval` seconds and at the
    last step (logger.progress=false: eval rows only)."""

    def __init__(self, total_steps: int, progress: bool = True, interval: float = 30.0,
                 stream: TextIO = sys.stdout):
        self.total, self.stream, self.interval = total_steps, stream, interval
        self.progress = progress
        self.use_bar = progress and (stream.isatty() or in_notebook())
        self.bar: Any = None
        self.start: tuple[int, float] | None = None  # (step, time) of the first train row: ETA's origin
        self.last_line = -float("inf")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.progress and "train/loss" in metrics:
            self._progress(step, metrics)
        evals = {k: v for k, v in metrics.items() if k.startswith("eval/")}
        if evals:
            self._print(row_lines(f"step {step}", evals))

    def _progress(self, step: int, metrics: dict[str, float]) -> None:
        now = time.monotonic()
        self.start = self.start or (step, now)
        tps = metrics.get("perf/tokens_per_sec", 0.0)
        if self.use_bar:
            postfix = f"loss {metrics['train/loss']:.4f}, {tps:,.0f} tok/s"
            if self.bar is None:
                self.bar = progress_bar(self.total, step, postfix, self.stream)
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(step - self.bar.n)
        elif now - self.last_line >= self.interval or step >= self.total:
            self.last_line = now
            percent = 100 * step // max(self.total, 1)
            head = f"step {step}/{self.total} ({percent}%, {self._eta(step, now)}, {tps:,.0f} tok/s)"
            self._print(row_lines(head, {k: v for k, v in metrics.items() if k.startswith("train/")}, inline=False))

    def _eta(self, step: int, now: float) -> str:
        first_step, first_time = self.start or (step, now)
        if step <= first_step:
            return "eta ?"
        left = (now - first_time) / (step - first_step) * (self.total - step)
        return f"eta {plain_tqdm.format_interval(left)}"

    def _print(self, lines: list[str]) -> None:
        text = "\n".join(lines)
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def rewind(self, step: int) -> None:
        pass

    def close(self, summary: dict[str, float] | None = None) -> None:
        if self.bar is not None:
            self.bar.close()
