"""Multi-turn rollouts on the host (the `env` group): each model turn is one run of a jitted turn
program over every row, each environment turn a batch of `step`s in the environment's worker.

A row's completion is its whole transcript after the prompt, packed and padded after the end:
the model's tokens (completion_mask 1: in the loss, the KL and the token counts) and the
environment's (env_mask 1: in the sequence the model reads, out of the loss). `width`
(algorithm.max_new_tokens) bounds the whole transcript, tool outputs included (TRL's
max_completion_length). Each turn reads the row's prompt and transcript as one left-padded
context [P + width] (a static shape: one compilation; the prefill is redone each turn, no
prefix is cached) and samples at most `width` tokens, stopping at EOS or one of the
environment's `stops`. A trajectory ends when its environment says done or fails, after
`env.max_turns` model turns, or when its budget is spent (`truncated`: a turn stopped at
neither, or an observation did not fit).
"""

from typing import Any, Callable

import numpy as np

from stack.errors import RunFailed
from stack.hardware.mesh import every_process


class Transcripts:
    """The rows' transcripts [R, width] as they grow, and what each trajectory did."""

    def __init__(self, rows: int, width: int, pad: int):
        self.tokens = np.full((rows, width), pad, np.int32)
        self.model = np.zeros((rows, width), np.int32)  # completion_mask
        self.env = np.zeros((rows, width), np.int32)  # env_mask
        self.logps = np.zeros((rows, width), np.float32)
        self.used, self.turns, self.calls = (np.zeros(rows, np.int32) for _ in range(3))
        self.done, self.truncated, self.errors = (np.zeros(rows, bool) for _ in range(3))
        self.reward = np.full(rows, np.nan, np.float32)

    def append(self, r: int, tokens: np.ndarray, logps: np.ndarray | None = None) -> bool:
        """Row r's next tokens (the model's when `logps` is given, else the environment's), cut at the
        budget; whether all of them fit."""
        start = self.used[r]
        n = min(len(tokens), self.tokens.shape[1] - start)
        self.tokens[r, start:start + n] = tokens[:n]
        (self.model if logps is not None else self.env)[r, start:start + n] = 1
        if logps is not None:
            self.logps[r, start:start + n] = logps[:n]
        self.used[r] += n
        return n == len(tokens)

    def contexts(self, prompt_ids: np.ndarray, prompt_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's prompt and transcript so far, left-padded to [R, P + width], and its mask."""
        rows, width = prompt_ids.shape[0], prompt_ids.shape[1] + self.tokens.shape[1]
        ids, mask = np.zeros((rows, width), np.int32), np.zeros((rows, width), np.int32)
        for r in range(rows):
            real = np.concatenate([prompt_ids[r][prompt_mask[r] > 0], self.tokens[r, :self.used[r]]])
            ids[r, width - len(real):], mask[r, width - len(real):] = real, 1
        return ids, mask

    def full(self, r: int) -> bool:
        """Whether row r's budget leaves no room for a model token."""
        return bool(self.used[r] >= self.tokens.shape[1])

    def end(self, r: int, error: bool = False) -> None:
        self.done[r] = True
        if error:
            self.errors[r], self.reward[r] = True, np.nan

    def columns(self) -> dict[str, np.ndarray]:
        """The experience columns (stack.algorithms.onpolicy.rollout's, and the environment's)."""
        return {"completion": self.tokens, "completion_mask": self.model, "env_mask": self.env,
                "truncated": self.truncated, "sampler_logps": self.logps, "env_reward": self.reward,
                "env_turns": self.turns.astype(np.float32), "env_calls": self.calls.astype(np.float32),
                "env_errors": self.errors.astype(np.float32)}


def first_prompts(env: Any, tokenizer: Any, prompt_ids: np.ndarray, prompt_mask: np.ndarray,
                  records: list[dict], t: Transcripts) -> None:
    """Reset each row's environment; a first prompt it returns replaces the row's (in place)."""
    width = prompt_ids.shape[1]
    for r, first in enumerate(env.reset(records)):
        if isinstance(first, Exception):
            t.end(r, error=True)
        elif first is not None:
            ids = tokenizer.encode(first)
            if len(ids) > width:
                raise RunFailed(f"environment {env.name!r}'s first prompt has {len(ids)} tokens and prompts have "
                                f"{width} (data.seq_len less algorithm.max_new_tokens); raise data.seq_len.")
            prompt_ids[r], prompt_mask[r] = 0, 0
            prompt_ids[r, width - len(ids):], prompt_mask[r, width - len(ids):] = ids, 1


def model_turn(t: Transcripts, out: dict[str, np.ndarray], stops: np.ndarray, tokenizer: Any,
               eos: tuple[int, ...]) -> tuple[list[int], list[str]]:
    """Append each live row's turn (tokens, mask, logps [R, N] of the turn program); the rows whose turn
    goes to their environment, and its text (EOS left out)."""
    rows, texts = [], []
    for r in np.flatnonzero(~t.done):
        n = int(out["mask"][r].sum())
        tokens = out["tokens"][r, :n]
        fits = t.append(r, tokens, out["logps"][r, :n])
        t.turns[r] += 1
        if not fits or n == 0 or tokens[-1] not in stops:
            t.truncated[r] = True
        rows.append(int(r))
        texts.append(tokenizer.decode([int(x) for x in tokens if x not in eos]))
    return rows, texts


def env_turn(t: Transcripts, env: Any, tokenizer: Any, rows: list[int], texts: list[str], last: bool) -> None:
    """Step the rows' environments with their turns: rewards summed, observations appended while the
    trajectory goes on."""
    for r, step in zip(rows, env.step(rows, texts), strict=True):
        if isinstance(step, Exception):
            t.end(r, error=True)
            continue
        if step.reward is not None:
            t.reward[r] = np.nan_to_num(t.reward[r]) + step.reward
        if step.done or t.truncated[r] or last:
            t.end(r)
        elif not t.append(r, np.asarray(tokenizer.encode(step.observation), np.int32)) or t.full(r):
            t.truncated[r] = True
            t.end(r)
        else:
            t.calls[r] += 1


def run_turns(turn: Callable[[np.ndarray, np.ndarray, int], dict[str, np.ndarray]], env: Any, tokenizer: Any,
              prompt_ids: np.ndarray, prompt_mask: np.ndarray, records: list[dict], width: int, pad: int,
              eos: tuple[int, ...]) -> dict[str, np.ndarray]:
    """The rows' trajectories (see the module docstring): `turn(context_ids, context_mask, t)` samples
    turn t of every row; returns the experience columns with the (possibly replaced) prompts."""
    prompt_ids, prompt_mask = prompt_ids.copy(), prompt_mask.copy()
    t = Transcripts(prompt_ids.shape[0], width, pad)
    first_prompts(env, tokenizer, prompt_ids, prompt_mask, records, t)
    stops = np.asarray([*eos, *stop_ids(env, tokenizer)], np.int32)
    for number in range(env.max_turns):
        if every_process(bool(t.done.all())):  # each process runs the turn program alike: it spans them all
            break
        out = turn(*t.contexts(prompt_ids, prompt_mask), number)
        rows, texts = model_turn(t, out, stops, tokenizer, eos)
        env_turn(t, env, tokenizer, rows, texts, number == env.max_turns - 1)
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, **t.columns()}


def stop_ids(env: Any, tokenizer: Any) -> tuple[int, ...]:
    """The token of each of the environment's `stops` (each must be one token)."""
    out = []
    for text in env.stops:
        ids = tokenizer.encode(text)
        if len(ids) != 1:
            raise RunFailed(f"environment {env.name!r}'s stop {text!r} is {len(ids)} tokens with this tokenizer; "
                            "a stop must be exactly one token.")
        out.append(ids[0])
    return tuple(out)
