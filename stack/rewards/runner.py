"""Reward functions in worker processes, each batch under a timeout.

A function is called with keywords, as TRL's GRPOTrainer calls it:
`fn(prompts=..., completions=..., **columns)`, so both `(prompts, completions, answer, **kw)`
and TRL's `(completions, **kwargs)` take it.

One spawned worker per function scores a batch; a function that raises, returns the wrong
number of values, does not answer within `timeout` seconds, or kills its worker process (a
crash in native code, `os._exit`) gives NaN for those samples (the worker is replaced, so the
run never hangs). A sample whose function returned None (TRL: not applicable to it) gets NaN, never
a silent 0; anything else that is not a finite number (a string, inf) gets NaN and one warning. A
worker that dies before it starts (a spawned process imports the main module first: a script
without the `if __name__ == "__main__":` guard runs itself again there) raises RunFailed.
"""

import warnings
from typing import Any, Callable

import numpy as np

from stack.hardware.worker import Worker


class RewardRunner:
    """Scores completions with named functions and weights (TRL `reward_weights`)."""

    def __init__(self, functions: list[tuple[str, Callable]], weights: list[float], timeout: float):
        self.names = [name for name, _ in functions]
        self.functions = [fn for _, fn in functions]
        self.weights, self.timeout = np.asarray(weights, np.float32), timeout
        self._workers: list[Worker | None] = [None] * len(functions)
        self._warned: set[str] = set()

    def __call__(self, prompts: list[str], completions: list[str], columns: dict[str, list]) -> np.ndarray:
        """[samples, functions] rewards, NaN where a function gave none."""
        for i, fn in enumerate(self.functions):
            self._workers[i] = self._workers[i] or Worker()
            self._workers[i].conn.send((fn, {**columns, "prompts": prompts, "completions": completions}))
        out = np.full((len(completions), len(self.functions)), np.nan, np.float32)
        for i, name in enumerate(self.names):
            out[:, i] = self._result(i, name, len(completions))
        return out

    def _result(self, i: int, name: str, n: int) -> np.ndarray:
        worker, self._workers[i] = self._workers[i], None  # put back below while it lives
        status, values = worker.reply(self.timeout, f"reward function {name!r}", "reward.timeout")
        if status != "lost":
            self._workers[i] = worker
        if status != "ok":
            return self._failed(name, values, n)
        if len(values) != n:
            return self._failed(name, f"returned {len(values)} values for {n} completions", n)
        return self._numbers(name, values)

    def _numbers(self, name: str, values: list[Any]) -> np.ndarray:
        """The finite numbers among `values`; NaN for None (TRL: not applicable to that sample) and,
        warned once, for anything else that is not a finite number (a string, inf, ...)."""
        out = np.full(len(values), np.nan, np.float32)
        bad = []
        for j, v in enumerate(values):
            number = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
            if number and np.isfinite(v):
                out[j] = v
            elif v is not None:
                bad.append(v)
        if bad:
            kinds = sorted({type(v).__name__ if not isinstance(v, float) else repr(v) for v in bad})
            self._failed(name, f"{len(bad)} of {len(values)} values are not finite numbers: {', '.join(kinds)}",
                         len(values))
        return out

    def _failed(self, name: str, why: str, n: int) -> np.ndarray:
        if name not in self._warned:  # once per function: counted in reward/errors every time
            self._warned.add(name)
            warnings.warn(f"reward function {name!r} failed ({why}); its samples score NaN and are left out "
                          "(counted in reward/errors).", RuntimeWarning, stacklevel=3)
        return np.full(n, np.nan, np.float32)

    def close(self) -> None:
        for worker in self._workers:
            if worker is not None:
                worker.close()
        self._workers = [None] * len(self.functions)
