"""Reward functions for the runner tests (importable by the spawned worker processes)."""

import time


def constant(prompts, completions, **record):
    return [1.0] * len(completions)


def raises(prompts, completions, **record):
    raise RuntimeError("the grader is broken")


def sleeps(prompts, completions, **record):
    time.sleep(60)
    return [1.0] * len(completions)


def some_none(prompts, completions, answer=None, **record):
    return [None if a == "?" else 0.5 for a in answer]


def wrong_length(prompts, completions, **record):
    return [1.0]
