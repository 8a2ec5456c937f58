"""Environments for the multi-turn tests (importable by spawned worker processes)."""

import time

from stack.rewards.environment import Step


class Chatter:
    """Always answers: each turn is rewarded its length, observed as "<text>"; done after 3 turns.
    Nearly every character ends a turn, so a random model's turns are short."""

    stops = tuple("abcdefghijklmnopqrstuvwxyz0123456789 ")

    def reset(self, record):
        self.turns = 0
        return None

    def step(self, completion):
        self.turns += 1
        return Step(f"<{completion}>", float(len(completion)), self.turns == 3)


class Flaky:
    """Fails on purpose by what the model wrote: "boom" raises, "bad" returns no Step, "slow" hangs."""

    stops = ()

    def reset(self, record):
        return None

    def step(self, completion):
        if completion == "boom":
            raise ValueError("the tool crashed")
        if completion == "bad":
            return "not a step"
        if completion == "slow":
            time.sleep(60)
        return Step("", 1.0, True)


class Greeter:
    """Writes its own first prompt."""

    stops = ()

    def reset(self, record):
        return f"hi {record['answer']}:"

    def step(self, completion):
        return Step(reward=1.0, done=True)
