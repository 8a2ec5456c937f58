"""What the on-policy algorithms (GRPO, PPO) share: the training forward over sampled
completions, their scoring (rule functions on the host or a reward model on device), and the
reward metrics."""

import json
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stack.algorithms.base import Batch, Context, Metrics
from stack.algorithms.rlmath import masked_mean, nanstd
from stack.data.tokenizers import stop_ids
from stack.hardware.mesh import from_process_rows, process_rows
from stack.models.modules import is_abstract
from stack.rewards.model import ModelReward
from stack.rollout import Sampling, generate, sample_keys

PROMPT_KEYS = ("prompt_ids", "prompt_mask", "index")  # what collect reads of a prompt batch


def rollout(policy: nnx.Module, b: Batch, key: jax.Array, number: jax.Array, sampling: Sampling) -> Batch:
    """`b`'s prompts [R] with a completion each (sample `number` [R] of its record), its mask, whether it
    hit max_new_tokens (`truncated`) and the sampler's log-probs."""
    out = generate(policy, b["prompt_ids"], b["prompt_mask"], sample_keys(key, b["index"], number), sampling)
    return {**b, "completion": out.tokens, "completion_mask": out.mask, "truncated": out.truncated,
            "sampler_logps": out.logps}


def sequences(xp: Batch) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(tokens, segments, positions) [R, P+N] of the left-padded prompts and their completions;
    segments mark the prompt's real tokens and every completion slot."""
    seq = jnp.concatenate([xp["prompt_ids"], xp["completion"]], -1)
    segments = jnp.concatenate([xp["prompt_mask"], jnp.ones_like(xp["completion"])], -1)
    return seq, segments, jnp.maximum(jnp.cumsum(segments, -1) - 1, 0)


def completion_logps(model: nnx.Module, xp: Batch, temperature: float, features: bool = False) -> tuple:
    """(log-probs, entropies) [R, N] of the completions under `model`'s training forward (and
    with `features` the final hidden states [R, N, d] that predict them: the state before each token)."""
    seq, segments, positions = sequences(xp)
    extra = {"features": True} if features else {}
    return model(seq[:, :-1], positions[:, :-1], segments[:, :-1], targets=xp["completion"],
                 temperature=temperature, **extra)


def completion_features(model: nnx.Module, xp: Batch) -> jax.Array:
    """The final hidden states [R, N, d] of `model` that predict each completion token (no LM head)."""
    seq, segments, positions = sequences(xp)
    n = xp["completion"].shape[-1]
    return model(seq[:, :-1], positions[:, :-1], segments[:, :-1], features=True)[:, -n:]


class Weighted(NamedTuple):
    """Named reward columns and their weights (a RewardRunner's `names` and `weights`)."""

    names: list[str]
    weights: np.ndarray


def host_rules(rewards: Any) -> Any:
    """The rule functions scored on the host: the `reward` group's runner, or the one a reward
    model holds beside it; None with a reward model alone (nothing to score on the host)."""
    return rewards.rules if isinstance(rewards, ModelReward) else rewards


def reward_model(policy: nnx.Module, ctx: Context) -> dict[str, nnx.Module]:
    """The frozen reward model under "reward_model" with `reward=model` (shape-only for mode=compile),
    else nothing: its scores are taken on device in collect (`with_model_scores`)."""
    if not isinstance(ctx.rewards, ModelReward):
        return {}
    return {"reward_model": ctx.rewards.load(abstract=is_abstract(policy), policy_cfg=ctx.model)}


def model_scores(scorer: nnx.Module, xp: Batch) -> jax.Array:
    """A reward model's score [R] of each prompt + completion, read at the completion's last real token."""
    tokens, _, positions = sequences(xp)
    return scorer(tokens, jnp.concatenate([xp["prompt_mask"], xp["completion_mask"]], -1), positions)


def with_model_scores(frozen: Any, xp: Batch) -> Batch:
    """`xp` with the reward model's scores (`rm_scores`) when the frozen modules hold one."""
    if frozen is None or not hasattr(frozen, "reward_model"):
        return xp
    return {**xp, "rm_scores": model_scores(frozen.reward_model, xp)}


def mismatch(xp: Batch, logps: jax.Array) -> jax.Array:
    """The largest |sampler log p − training log p| over the completion tokens."""
    return jnp.where(xp["completion_mask"] > 0, jnp.abs(xp["sampler_logps"] - logps), 0).max()


def score_on_host(tokenizer: Any, rewards: Any, xp: Batch, host: dict[str, np.ndarray], rows: Any,
                  answers: Callable[[list[str], int], np.ndarray] | None = None) -> np.ndarray | jax.Array:
    """[n, rows, functions] rule rewards of the decoded completions (NaN: no reward); the host
    columns (e.g. `answer`) are repeated for the completions of each prompt. Each process scores
    the completions of its own prompts (`rows`: the batch sharding, stack.hardware.mesh.process_rows).
    A multi-turn completion is its whole transcript, the environment's tokens included.
    `answers(completions, rows per prompt)`: one more column (stack.algorithms.sampled_eval)."""
    real = xp["completion_mask"] + xp["env_mask"] if "env_mask" in xp else xp["completion_mask"]
    ids, prompt_mask, completion, mask = process_rows((xp["prompt_ids"], xp["prompt_mask"], xp["completion"], real),
                                                      rows)
    n, local = completion.shape[:2]
    group = local // next(iter(host.values())).shape[1]
    eos = stop_ids(tokenizer)
    prompts = [tokenizer.decode(p[m > 0].tolist()) for p, m in zip(ids.reshape(n * local, -1),
                                                                   prompt_mask.reshape(n * local, -1), strict=True)]
    completion_rows = list(zip(completion.reshape(n * local, -1), mask.reshape(n * local, -1), strict=True))
    completion_ids = [c[m > 0].tolist() for c, m in completion_rows]  # EOS included, as TRL
    completions = [tokenizer.decode(c[(m > 0) & ~np.isin(c, eos)].tolist()) for c, m in completion_rows]
    host = {k: np.repeat(v, group, axis=1).reshape(-1).tolist() for k, v in host.items()}
    scores = rewards(*reward_inputs(prompts, completions, {**host, "completion_ids": completion_ids}))
    if answers is not None:
        scores = np.concatenate([scores, answers(completions, group)[:, None]], -1)
    return from_process_rows(scores.reshape(n, local, -1), rows)


def reward_inputs(prompts: list[str], completions: list[str], host: dict[str, list]) -> tuple[list, list, dict]:
    """(prompts, completions, columns) as TRL's GRPOTrainer hands them to reward functions: the
    columns are `answer`, `completion_ids` and each record field (`fields`, JSON per completion,
    stack.data.records.reward_fields; None where a record lacks one, as in a Hugging Face dataset);
    of a conversational prompt, the prompt is its messages and the completion
    `[{"role": "assistant", "content": text}]`."""
    columns = {k: v for k, v in host.items() if k != "fields"}
    fields = [json.loads(text) for text in host.get("fields", [])]
    for key in sorted({key for record in fields for key in record}):
        columns[key] = [record.get(key) for record in fields]
    chats = columns.pop("prompt", [None] * len(prompts))
    return ([text if chat is None else chat for text, chat in zip(prompts, chats, strict=True)],
            [text if chat is None else [{"role": "assistant", "content": text}]
             for text, chat in zip(completions, chats, strict=True)], columns)


def rule_rewards(rewards: Any, xp: Batch, scores: jax.Array) -> tuple[jax.Array, Metrics]:
    """The weighted reward per completion (TRL's nansum over functions; NaN when none scored)
    and the metrics train and eval log."""
    valid = ~jnp.all(jnp.isnan(scores), -1)
    reward = jnp.where(valid, jnp.nansum(scores * jnp.asarray(rewards.weights), -1), jnp.nan)
    metrics = {"reward": jnp.nanmean(reward), "reward/errors": jnp.isnan(scores).sum().astype(jnp.float32),
               **completion_metrics(xp)}
    for i, name in enumerate(rewards.names):
        metrics[f"rewards/{name}/mean"] = jnp.nanmean(scores[..., i])
        metrics[f"rewards/{name}/std"] = nanstd(scores[..., i])
    return reward, metrics


def scored_rewards(rewards: Any, xp: Batch, scores: jax.Array | None,
                   env_weight: float | None = None) -> tuple[jax.Array, Metrics]:
    """The reward per completion and its metrics (rule_rewards) of the rule functions' `scores`
    [.., functions] (None: none on the host) and the columns collect added: a reward model's scores,
    weighted by `rewards.weight` (TRL's GRPOTrainer: a model is one of the reward functions, logged as
    rewards/<its name>/mean; here `rewards/reward_model/mean`), and an environment's rewards
    (`env_reward`, weighted by `env_weight`, None: 1.0; `rewards/env/mean`)."""
    env_weight = 1.0 if env_weight is None else env_weight
    extra = [(name, xp[key][..., None], weight) for key, name, weight in
             (("rm_scores", "reward_model", getattr(rewards, "weight", None)), ("env_reward", "env", env_weight))
             if key in xp]
    if not extra:
        return rule_rewards(rewards, xp, scores)
    rules = host_rules(rewards)
    names, weights = ([], []) if rules is None else (list(rules.names), list(rules.weights))
    columns = ([] if scores is None else [scores]) + [column for _, column, _ in extra]
    both = Weighted([*names, *(name for name, _, _ in extra)],
                    np.asarray([*weights, *(weight for _, _, weight in extra)], np.float32))
    return rule_rewards(both, xp, jnp.concatenate(columns, -1))


def completion_metrics(xp: Batch) -> Metrics:
    """Completion lengths as TRL GRPOTrainer logs them: all, and of the terminated ones (0 if none)."""
    lengths, ended = xp["completion_mask"].sum(-1).astype(jnp.float32), ~xp["truncated"].astype(bool)
    any_ended = ended.any()
    return {"completions/mean_length": lengths.mean(), "completions/min_length": lengths.min(),
            "completions/max_length": lengths.max(), "completions/clipped_ratio": xp["truncated"].mean(),
            "completions/mean_terminated_length": jnp.where(any_ended, masked_mean(lengths, ended), 0.0),
            "completions/min_terminated_length": jnp.where(any_ended, jnp.where(ended, lengths, jnp.inf).min(), 0.0),
            "completions/max_terminated_length": jnp.where(any_ended, jnp.where(ended, lengths, -jnp.inf).max(), 0.0),
            **env_metrics(xp)}


def env_metrics(xp: Batch) -> Metrics:
    """Of multi-turn rollouts (stack.algorithms.transcripts): model turns per trajectory, the fraction of
    trajectories the environment answered at least once (a tool environment's tool-call rate), the
    trajectories an environment failure ended."""
    if "env_turns" not in xp:
        return {}
    return {"env/turns": xp["env_turns"].mean(), "env/tool_call_rate": (xp["env_calls"] > 0).mean(),
            "env/errors": xp["env_errors"].sum()}
