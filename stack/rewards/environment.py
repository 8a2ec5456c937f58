"""Environments of multi-turn rollouts (the `env` group): the model's turns alternate with an
environment's (a tool's output, an observation) until the environment is done.

One Environment object per trajectory, made by its class with no arguments, in a worker process
(stack.rewards.env_runner):
- `reset(record) -> str | None`: the first prompt (text, encoded as it is), or None: the record's
  prompt as the `data` group encoded it. `record` holds the prompt (text, or a conversation's
  messages) and the record's columns (`answer`, each field), as reward functions get them.
- `step(completion) -> Step`: called with the text of each model turn (EOS left out). Its
  `observation` is appended to the sequence (its tokens are in the sequence and out of the loss);
  its `reward`s are summed over the trajectory (None: none); `done` ends the trajectory.
- `stops`: texts, each one token, that end a model turn besides EOS (e.g. a tool call's closing
  token); the model's turn includes it, so it learns to stop there.
Peers: TRL GRPOTrainer's environment_factory, Tunix's agentic rollouts, verl's agent loop.
"""

from typing import Any, ClassVar, NamedTuple, Protocol


class Step(NamedTuple):
    """What an environment answers to a model turn."""

    observation: str = ""  # appended after the turn unless done
    reward: float | None = None  # summed over the trajectory's steps; None: no reward from this step
    done: bool = False


class Environment(Protocol):
    stops: ClassVar[tuple[str, ...]]

    def reset(self, record: dict[str, Any]) -> str | None: ...

    def step(self, completion: str) -> Step: ...
