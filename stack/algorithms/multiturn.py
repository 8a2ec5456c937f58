"""GRPO's multi-turn rollouts (the `env` group): a prompt batch expanded to its rows (G samples per
prompt in training, the greedy one in eval), their records for the environments, and the turn
program on device. The host loop between turns is stack.algorithms.transcripts."""

from dataclasses import replace
from typing import Any, Callable

import jax
import numpy as np
from flax import nnx

from stack.algorithms.base import Batch, map_micro
from stack.algorithms.onpolicy import PROMPT_KEYS, reward_inputs
from stack.algorithms.transcripts import run_turns, stop_ids
from stack.hardware.mesh import from_process_rows, process_rows
from stack.rollout import Sampling, generate, sample_keys

TURN_KEYS = ("context_ids", "context_mask", "index", "number")


def turn_program(policy: nnx.Module, batch: Batch, key: jax.Array, sampling: Sampling) -> Batch:
    """Turn `batch["turn"]` of every row: tokens, mask and log-probs [n, R, N] sampled after the contexts
    [n, R, W]; a row's keys are sample_keys(fold_in(key, turn)) of its record and sample number."""
    key = jax.random.fold_in(key, batch["turn"])

    def one(b: Batch) -> Batch:
        keys = sample_keys(key, b["index"], b["number"])
        out = generate(policy, b["context_ids"], b["context_mask"], keys, sampling)
        return {"tokens": out.tokens, "mask": out.mask, "logps": out.logps}

    return map_micro(one, {k: batch[k] for k in TURN_KEYS})


def turn_samplings(greedy: Sampling, sampling: Sampling, env: Any, tokenizer: Any) -> tuple[Sampling, Sampling]:
    """The turn program's (eval, train) sampling: turns end at EOS or one of the environment's stops."""
    stops = (*sampling.eos_ids, *stop_ids(env, tokenizer))
    return replace(greedy, eos_ids=stops), replace(sampling, eos_ids=stops)


def env_records(tokenizer: Any, ids: np.ndarray, mask: np.ndarray, host: dict[str, np.ndarray],
                group: int) -> list[dict[str, Any]]:
    """Each row's record for its environment's reset: the prompt (text, or a conversation's messages)
    and the record's columns, as reward functions get them (stack.algorithms.onpolicy.reward_inputs)."""
    texts = [tokenizer.decode(p[m > 0].tolist()) for p, m in zip(ids, mask, strict=True)]
    columns = {k: np.repeat(v, group, axis=1).reshape(-1).tolist() for k, v in host.items()}
    prompts, _, columns = reward_inputs(texts, [""] * len(texts), columns)
    return [{"prompt": p, **{k: v[i] for k, v in columns.items()}} for i, p in enumerate(prompts)]


def interaction(turn: Callable[[Batch], Batch], batch: Batch, host: dict[str, np.ndarray], group: int,
                setting: tuple[Any, Any, Any], width: int, pad: int, eos: tuple[int, ...]) -> Batch:
    """The experience of `batch`'s prompts [n, P], `group` rows each, by multi-turn rollouts: this
    process's rows on the host (`setting`: tokenizer, environments, the batch sharding), the turns on
    device by `turn`."""
    tokenizer, env, rows = setting
    local = process_rows({k: batch[k] for k in PROMPT_KEYS}, rows)
    n, r = local["index"].shape
    local = {k: np.repeat(v, group, axis=1) for k, v in local.items()}
    number = np.tile(np.arange(group, dtype=np.int32), (n, r))
    flat = lambda x: x.reshape(n * r * group, *x.shape[2:])  # noqa: E731

    def one_turn(ids: np.ndarray, mask: np.ndarray, t: int) -> dict[str, np.ndarray]:
        contexts = {"context_ids": ids.reshape(n, r * group, -1), "context_mask": mask.reshape(n, r * group, -1),
                    "index": local["index"], "number": number}
        out = turn({**{k: from_process_rows(v, rows) for k, v in contexts.items()}, "turn": np.int32(t)})
        return {k: flat(v) for k, v in process_rows(out, rows).items()}

    records = env_records(tokenizer, flat(local["prompt_ids"]), flat(local["prompt_mask"]), host, group)
    columns = run_turns(one_turn, env, tokenizer, flat(local["prompt_ids"]), flat(local["prompt_mask"]), records,
                        width, pad, eos)
    out = {**local, **{k: v.reshape(n, r * group, *v.shape[1:]) for k, v in columns.items()}}
    return {k: from_process_rows(v, rows) for k, v in out.items()}


def interaction_specs(batch: dict[str, jax.ShapeDtypeStruct], group: int,
                      width: int) -> tuple[dict[str, jax.ShapeDtypeStruct], dict[str, jax.ShapeDtypeStruct]]:
    """(what `interaction` makes of a prompt batch, a turn's input) as shapes, for mode=compile."""
    n, b, p = batch["prompt_ids"].shape
    rows, sharding = b * group, batch["prompt_ids"].sharding
    spec = lambda *shape, dtype=np.int32: jax.ShapeDtypeStruct((n, rows, *shape), dtype, sharding=sharding)  # noqa: E731
    rolled = {**{k: spec(*batch[k].shape[2:], dtype=batch[k].dtype) for k in PROMPT_KEYS},
              "completion": spec(width), "completion_mask": spec(width), "env_mask": spec(width),
              "truncated": spec(dtype=bool), "sampler_logps": spec(width, dtype=np.float32),
              **{k: spec(dtype=np.float32) for k in ("env_reward", "env_turns", "env_calls", "env_errors")}}
    turn = {"context_ids": spec(p + width), "context_mask": spec(p + width), "index": spec(), "number": spec(),
            "turn": jax.ShapeDtypeStruct((), np.int32)}
    return rolled, turn
