"""Metrics hooks: the logging window (means of the steps since the last log), throughput/MFU and
the peak MFU divides by."""

import functools
import time
from typing import Any

import jax
import numpy as np

from stack.engine.trainer.context import Hook, Run
from stack.hardware.platform import mfu_metrics


@functools.cache
def on_cpu() -> bool:
    """Whether arrays live in host memory (the default backend is the CPU)."""
    return jax.default_backend() == "cpu"


def to_host(tree: Any) -> Any:
    """A logging step's small tree on the host. On an accelerator every copy is started first, then
    each leaf is read (faster than `jax.device_get`); a CPU array is read as it is (the copy call
    alone costs more, the more while a step runs)."""
    leaves, treedef = jax.tree.flatten(tree)
    if not on_cpu():
        for x in leaves:
            if isinstance(x, jax.Array):
                x.copy_to_host_async()
    return jax.tree.unflatten(treedef, [np.asarray(x) if isinstance(x, jax.Array) else x for x in leaves])


def means(rows: list[dict[str, Any]], prefix: str, skip: tuple[str, ...] = ()) -> dict[str, float]:
    """Per-key means of host metric dicts, keys in `skip` left out; one row is its own mean."""
    if len(rows) == 1:
        return {f"{prefix}{k}": float(v) for k, v in rows[0].items() if k not in skip}
    return {f"{prefix}{k}": float(np.mean([m[k] for m in rows])) for k in rows[0] if k not in skip}


def window_mean(window: list[dict[str, Any]], prefix: str) -> dict[str, float]:
    """Per-key means of a list of metric dicts (the host sync of a logging step)."""
    return means(to_host(window), prefix)


class MetricsLog(Hook):
    """Keeps each step's metrics on device; a logging step takes the window since the last one,
    and its row gets the window's means as `train/*`, the step's learning rate (the update's own,
    not a mean) and the data epoch."""

    def __init__(self, feed: Any):
        self.feed = feed
        self.window: list[dict[str, jax.Array]] = []
        self.data_state: Any = None  # the data state of the window's last step

    def after_step(self, run: Run, metrics: dict[str, jax.Array], row: dict[str, float]) -> None:
        self.window.append(metrics)
        self.data_state = run.data_state

    def take(self, run: Run) -> tuple[list[dict[str, jax.Array]], Any]:
        window, self.window = self.window, []
        return window, self.data_state

    def log(self, run: Run, rows: list[tuple[dict[str, float], Any]]) -> None:
        windows = to_host([window for _, (window, _) in rows])  # one fetch for every held row
        for (row, (_, data_state)), host in zip(rows, windows, strict=True):
            row.update(means(host, "train/", skip=("lr",)))
            if "lr" in host[-1]:
                row["train/lr"] = float(host[-1]["lr"])
            row["data/epoch"] = self.feed.batches.epoch(data_state)
        run.train = {k: v for k, v in rows[-1][0].items() if k.startswith(("train/", "data/"))}


class Throughput(Hook):
    """perf/* at logging steps (tokens/s, step seconds, data wait, TFLOP/s, MFU; on-policy: `eps`) and for the
    whole run; the first step (compilation) is timed apart and left out. A row's rates are those of
    the steps the device finished between the loop's last two waits that completed rows (the
    rows held between two waits share them)."""

    def __init__(self, feed: Any):
        self.feed = feed
        self.wall_start = self.start = self.window_start = self.steady_start = 0.0
        self.window_first = self.steady_steps = 0  # the step the window starts after

    def on_start(self, run: Run) -> None:
        self.wall_start, self.start = time.perf_counter(), run.clock.now()

    def after_step(self, run: Run, metrics: dict[str, jax.Array], row: dict[str, float]) -> None:
        if run.step == run.first_step:  # compiled and ran once: the steady state starts here
            jax.block_until_ready(metrics)
            # + the first round's compile beside the model init (stack.engine.precompile), 0 without it
            run.perf["compile_seconds"] = run.clock.now() - self.start + run.perf.get("precompile_seconds", 0.0)
            self._reset(run, run.step)
            self.steady_start = self.window_start
            return
        self.steady_steps += 1

    def take(self, run: Run) -> int:
        return run.step

    def log(self, run: Run, rows: list[tuple[dict[str, float], Any]]) -> None:
        """The rates of the steps finished since the window started (the device ran them all), on
        the rows of those steps (not the first step's: it compiled, and its row may be held with them)."""
        steps, seconds = run.synced - self.window_first, run.clock.now() - self.window_start
        if steps > 0 and seconds > 0:
            rates = {**self._rates(run, steps, seconds),
                     "perf/data_wait_fraction": self.feed.stalled / seconds,  # the device waited for data
                     "perf/data_read_fraction": self.feed.read_seconds / seconds}  # the host read (overlapped)
            for row, step in rows:
                if step > self.window_first:
                    row.update(rates)
            self._reset(run, run.synced)

    def _reset(self, run: Run, finished: int) -> None:
        """A new window from now, after step `finished` (the device has finished it)."""
        self.window_start, self.window_first = run.clock.now(), finished
        self.feed.read_seconds = self.feed.stalled = 0.0

    def _rates(self, run: Run, steps: int, seconds: float) -> dict[str, float]:
        exp = run.exp
        tokens_per_sec = steps * run.tokens_per_step / seconds if seconds > 0 else 0.0
        rates = {"perf/tokens_per_sec": tokens_per_sec, "perf/step_seconds": seconds / max(steps, 1),
                 **mfu_metrics(exp.flops_per_token, tokens_per_sec, exp.mesh.size, exp.peak_flops_per_device)}
        if run.episodes_per_step and seconds > 0:  # TRL's eps: sampled episodes (completions) per second
            rates["eps"] = steps * run.episodes_per_step / seconds
        return rates

    def on_end(self, run: Run) -> None:
        jax.block_until_ready(run.state.params)
        run.perf["seconds"] = time.perf_counter() - self.wall_start
        if self.steady_steps:  # else the run's one step compiled: no rate (it was recorded as 0 tok/s)
            rates = self._rates(run, self.steady_steps, run.clock.now() - self.steady_start)
            run.perf.update({k: v for k, v in rates.items() if k != "perf/step_seconds"})


class PeakProbe(Hook):
    """Resolves the peak FLOP/s of MFU right after the first step, once the device has finished it:
    on CPU, where stack.hardware.platform.measure_cpu_peak probes a machine once, the probe then has the
    cores to itself, neither in front of the first step nor beside stack.engine.precompile's compile (which
    cost it ~0.5 s of the first run's critical path and made the cached peak read low: 223 against
    250-400 GFLOP/s alone). Its time is left out of the step time (a paused clock)."""

    def after_step(self, run: Run, metrics: dict[str, jax.Array], row: dict[str, float]) -> None:
        if run.step == run.first_step:
            jax.block_until_ready(metrics)
            with run.clock.paused():
                run.perf["peak_flops_per_device"] = run.exp.peak_flops_per_device
