"""The `env` group's environments (stack.rewards.environment) in a worker process, with the rules
of reward functions (stack.rewards.runner): one environment object per trajectory lives in a
spawned worker; each batch of resets or steps must answer within `timeout` seconds. An
environment that raises or answers something that is not a Step ends its trajectory with a NaN
reward (left out of the advantages, counted in env/errors, warned once); a batch that times out
or kills the worker ends all of its trajectories so, and the worker is replaced.
"""

import math
import warnings
from typing import Any, Callable

from stack.hardware.worker import Worker
from stack.rewards.environment import Step

_ENVS: list[Any] = []  # in the worker process: this batch's environments, by row


def _reset(factory: Callable[[], Any], records: list[dict]) -> list[tuple[str, Any]]:
    """Worker side: one environment per record, reset; ("ok", first prompt or None) or ("error", why) each."""
    _ENVS[:] = []
    out = []
    for record in records:
        try:
            _ENVS.append(factory())
            out.append(("ok", _ENVS[-1].reset(record)))
        except Exception as exc:  # this trajectory's failure only
            _ENVS.append(None)
            out.append(("error", f"{type(exc).__name__}: {exc}"))
    return out


def _step(rows: list[int], completions: list[str]) -> list[tuple[str, Any]]:
    """Worker side: ("ok", (observation, reward, done)) or ("error", why) of each row's environment."""
    out = []
    for row, text in zip(rows, completions, strict=True):
        try:
            out.append(("ok", tuple(_ENVS[row].step(text))))
        except Exception as exc:
            out.append(("error", f"{type(exc).__name__}: {exc}"))
    return out


def checked(answer: tuple[str, Any]) -> Step | str:
    """The Step of a worker's answer, or why it is not one."""
    status, value = answer
    if status != "ok":
        return value
    if not isinstance(value, tuple) or len(value) != 3:
        return f"step returned {value!r}, not a Step(observation, reward, done)"
    observation, reward, done = value
    number = isinstance(reward, (int, float)) and not isinstance(reward, bool) and math.isfinite(reward)
    if not isinstance(observation, str) or not isinstance(done, bool) or not (reward is None or number):
        return f"step returned {value!r}: observation must be a str, reward a finite number or None, done a bool"
    return Step(observation, None if reward is None else float(reward), done)


class EnvRunner:
    """Environments of class `factory` for a batch of trajectories (see the module docstring)."""

    def __init__(self, name: str, factory: Callable[[], Any], max_turns: int, weight: float, timeout: float):
        self.name, self.factory, self.max_turns = name, factory, max_turns
        self.weight, self.timeout = weight, timeout
        self.stops: tuple[str, ...] = tuple(getattr(factory, "stops", ()))
        self._worker: Worker | None = None
        self._warned = False

    def reset(self, records: list[dict]) -> list[str | None | Exception]:
        """Each record's first prompt (None: its own); a failed one as a RuntimeError."""
        answers = self._call(_reset, {"factory": self.factory, "records": records}, len(records))
        return [value if status == "ok" else self._failed(value) for status, value in answers]

    def step(self, rows: list[int], completions: list[str]) -> list[Step | Exception]:
        """The Step of each row's environment for its model turn; a failed one as a RuntimeError."""
        answers = self._call(_step, {"rows": rows, "completions": completions}, len(rows))
        steps = [checked(a) for a in answers]
        return [s if isinstance(s, Step) else self._failed(s) for s in steps]

    def _call(self, fn: Callable, kwargs: dict, n: int) -> list[tuple[str, Any]]:
        worker, self._worker = self._worker or Worker(), None  # put back below while it lives
        worker.conn.send((fn, kwargs))
        status, answers = worker.reply(self.timeout, f"environment {self.name!r}", "env.timeout")
        if status == "lost":
            return [("error", answers)] * n
        self._worker = worker
        return answers if status == "ok" else [("error", answers)] * n

    def _failed(self, why: str) -> RuntimeError:
        if not self._warned:  # once: counted in env/errors every time
            self._warned = True
            warnings.warn(f"environment {self.name!r} failed ({why}); its trajectory ends with a NaN reward and "
                          "is left out (counted in env/errors).", RuntimeWarning, stacklevel=3)
        return RuntimeError(why)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None
