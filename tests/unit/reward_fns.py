"""Reward functions (and two schedules) for the runner and launcher tests (importable by spawned processes)."""

import os
import time

import numpy as np


def constant(prompts, completions, **record):
    return [1.0] * len(completions)


def raises(prompts, completions, **record):
    raise RuntimeError("the grader is broken")


def sleeps(prompts, completions, **record):
    time.sleep(60)
    return [1.0] * len(completions)


def kills_its_process(prompts, completions, **record):
    os._exit(3)  # as a crash in native code would: no exception, no answer


def some_none(prompts, completions, answer=None, **record):
    return [None if a == "?" else 0.5 for a in answer]


def not_numbers(prompts, completions, **record):
    """A string, infinities and a numpy number: only the number is a reward."""
    return (["0.5", float("inf"), -float("inf"), np.float32(0.25)] * len(completions))[:len(completions)]


def wrong_length(prompts, completions, **record):
    return [1.0]


def trl_style(completions, **kwargs):
    """A reward as TRL's docs write one: the completions alone (text, or conversational), the rest as keywords."""
    return [-abs(3 - len(c[0]["content"] if isinstance(c, list) else c)) for c in completions]


def by_solution(prompts, completions, solution, **kwargs):
    """A reward reading a record column other than `answer` (None where a record has none)."""
    return [None if s is None else float(s in c) for c, s in zip(completions, solution, strict=True)]


def echo(prompts, completions, completion_ids, solution, **kwargs):
    """Encodes what it was given: len(completion_ids) + 10 x len(completion) + 100 x (solution given)."""
    return [len(i) + 10 * len(c) + 100 * (s is not None) + 1000 * len(p)
            for p, c, i, s in zip(prompts, completions, completion_ids, solution, strict=True)]


def schedule_failing_on_process_1(peak_value: float, **_):
    """An lr schedule factory (`optimizer.schedule._target_`) that raises on rank 1 of a
    multi-process run only, while rank 0 goes on into the first collective."""
    import optax

    if os.environ.get("STACK_PROCESS_ID") == "1":
        raise RuntimeError("the schedule fails on process 1")
    return optax.constant_schedule(peak_value)


def fingerprint(prompts, completions, answer=None, **record):
    """A reward that differs for nearly every (prompt, completion, answer) triple: any misaligned
    row changes it."""
    return [(len(p) * 7 + len(c) * 3 + int(a)) % 11 / 10 for p, c, a in zip(prompts, completions, answer, strict=True)]


def schedule_nan_from(peak_value: float, nan_from: int = 30, **_):
    """An lr schedule factory that turns NaN at update `nan_from`: a run trains, then its loss
    goes non-finite well after the loop's first waits."""
    import jax.numpy as jnp

    return lambda count: jnp.where(count < nan_from, peak_value, jnp.nan)
