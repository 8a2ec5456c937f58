"""Evaluation of GRPO and PPO on the held-out prompts (the `eval` keys): each prompt's greedy
completion and, with `eval.num_samples` = n, n sampled ones. Reported:
- `accuracy`: the greedy completions' rate of right answers. A completion is right when the
  `eval.correct` reward function (default `accuracy`) scores it >= 1 (NaN: the prompt is left out);
- `pass@k`, k = 1, 2, 4, .. below n, and n: the unbiased estimator of Chen et al. 2021 (Codex),
  1 − C(n−c, k) / C(n, k) for a prompt with c right of its n samples, averaged over the prompts;
- `maj@k`, the same k: the most frequent answer of the first k samples is right (self-consistency,
  Wang et al. 2022; Minerva's maj1@k). Answers are `stack.rewards.functions.final_answer`; a
  sample without one does not vote; a tie goes to the answer sampled first.
`reward`, `rewards/*` and `completions/*` stay the greedy completions'. A prompt's rows are its
greedy completion, then samples 1..n (sample_keys of the record and the sample number under the
run's fixed eval key: every eval draws the same samples). The host adds one column to the scores:
a sample's answer as the number of the prompt's first sample with the same answer (NaN: none).
"""

from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stack.algorithms.base import Batch, Metrics, map_micro
from stack.algorithms.onpolicy import PROMPT_KEYS, rollout, score_on_host, scored_rewards, with_model_scores
from stack.rewards.functions import final_answer
from stack.rollout import Sampling

NUMBER = "sample_number"  # the xp column of a sampled eval: 0 the greedy row, 1..n the samples


@dataclass(frozen=True)
class EvalSampling:
    """The greedy decoding, how many samples per eval prompt (0: greedy only) and how they are
    drawn, and the scores' column that marks a right answer (None: no such reward function)."""

    greedy: Sampling
    samples: int = 0
    sampling: Sampling | None = None
    correct: int | None = None


def eval_sampling(cfg: Any, sampling: Sampling, rules: Any) -> EvalSampling:
    """From the `eval` config (None: greedy only), the algorithm's `sampling` and its host reward
    functions (`rules`: a RewardRunner, or None with a reward model alone)."""
    names = [] if rules is None else list(rules.names)
    want = (cfg.correct if cfg is not None else None) or "accuracy"
    correct = names.index(want) if want in names else None
    greedy = replace(sampling, temperature=0.0)
    if cfg is None or not cfg.num_samples:
        return EvalSampling(greedy, correct=correct)
    temperature = sampling.temperature if cfg.temperature is None else cfg.temperature
    return EvalSampling(greedy, cfg.num_samples, replace(sampling, temperature=temperature), correct)


def eval_collect(policy: nnx.Module, frozen: Any, batch: Batch, key: jax.Array, ev: EvalSampling) -> Batch:
    """The eval's experience of prompt micro-batches [n, P]: eval_rollout, with a reward model's scores."""
    prompts = {k: batch[k] for k in PROMPT_KEYS}
    return map_micro(lambda b: with_model_scores(frozen, eval_rollout(policy, b, key, ev)), prompts)


def eval_rollout(policy: nnx.Module, b: Batch, key: jax.Array, ev: EvalSampling) -> Batch:
    """Each prompt's greedy completion, then its `ev.samples` sampled ones: rows [P·(1+n)] by prompt."""
    first = rollout(policy, b, key, jnp.zeros_like(b["index"]), ev.greedy)
    n, rows = ev.samples, b["index"].shape[0]
    if not n:
        return first
    many = jax.tree.map(lambda x: jnp.repeat(x, n, axis=0), b)
    sampled = rollout(policy, many, key, jnp.tile(jnp.arange(1, n + 1), rows), ev.sampling)

    def join(g: jax.Array, s: jax.Array) -> jax.Array:
        both = jnp.concatenate([g[:, None], s.reshape(rows, n, *s.shape[1:])], 1)
        return both.reshape(rows * (n + 1), *s.shape[1:])

    return {**jax.tree.map(join, first, sampled), NUMBER: jnp.tile(jnp.arange(n + 1), rows)}


def answer_ids(completions: list, group: int) -> np.ndarray:
    """[len(completions)]: per prompt (`group` rows: greedy, then samples), each sample's answer as
    the number of the prompt's first sample with the same answer; NaN for the greedy row and a
    sample without an answer."""
    out = np.full(len(completions), np.nan, np.float32)
    for start in range(0, len(completions), group):
        first: dict[str, int] = {}
        for j in range(1, group):
            answer = final_answer(completions[start + j])
            if answer is not None:
                out[start + j] = first.setdefault(answer, j)
    return out


def host_scores(tokenizer: Any, rules: Any, xp: Batch, host: dict[str, np.ndarray], rows: Any) -> Any:
    """[n, rows, functions] rule rewards (stack.algorithms.onpolicy.score_on_host); of a sampled eval's
    rows, with the answer ids as one more column."""
    return score_on_host(tokenizer, rules, xp, host, rows, answer_ids if NUMBER in xp else None)


def host_scores_spec(rules: Any, xp: Batch) -> jax.ShapeDtypeStruct:
    """The shape of `host_scores`' result for experience of `xp`'s shapes."""
    return jax.ShapeDtypeStruct((*xp["completion"].shape[:2], len(rules.names) + (NUMBER in xp)), jnp.float32)


def ks(n: int) -> list[int]:
    """The k reported for n samples: the powers of two below n, and n."""
    return [2**i for i in range(n.bit_length()) if 2**i < n] + [n]


def pass_at_k(right: jax.Array, k: int) -> jax.Array:
    """[..] the unbiased pass@k of samples [.., n] (right or not): 1 − Π_{i=n−c+1}^{n} (1 − k/i),
    the numerically stable form of 1 − C(n−c, k)/C(n, k) (Chen et al. 2021); 1 when n − c < k."""
    n = right.shape[-1]
    c = right.sum(-1, keepdims=True)
    i = jnp.arange(1, n + 1)
    return 1.0 - jnp.prod(jnp.where(i > n - c, 1.0 - k / i, 1.0), -1)


def majority_right(answers: jax.Array, right: jax.Array, k: int) -> jax.Array:
    """[..] whether the most frequent answer of the first k samples [.., n] is right (answers: ids,
    NaN: no vote; a tie: the answer sampled first)."""
    a, r = answers[..., :k], right[..., :k]
    votes = (a[..., :, None] == a[..., None, :]).sum(-1)  # NaN equals nothing: 0 votes
    winner = jnp.argmax(votes, -1)[..., None]  # the first of the most voted: the earliest sampled
    return (votes.max(-1) > 0) & jnp.take_along_axis(r, winner, -1)[..., 0]


def _rate(values: jax.Array, correct: jax.Array) -> jax.Array:
    """The mean of `values` over the prompts whose `correct` scores are not all NaN [.., n]."""
    scored = ~jnp.all(jnp.isnan(correct), -1)
    return jnp.sum(jnp.where(scored, values, 0.0)) / jnp.maximum(scored.sum(), 1)


def eval_metrics(rewards: Any, xp: Batch, scores: jax.Array | None, ev: EvalSampling,
                 env_weight: float | None = None) -> Metrics:
    """The greedy completions' reward metrics (scored_rewards; `env_weight`: an environment's, GRPO) and
    accuracy; pass@k and maj@k of the samples."""
    n = ev.samples
    if not n:
        metrics = scored_rewards(rewards, xp, scores, env_weight)[1]
        if ev.correct is not None:
            correct = scores[..., ev.correct]
            metrics["accuracy"] = _rate((correct >= 1).astype(jnp.float32), correct[..., None])
        return metrics
    by_prompt = lambda x: x.reshape(x.shape[0], -1, n + 1, *x.shape[2:])  # noqa: E731  [m, R] -> [m, P, 1+n]
    greedy = {k: by_prompt(v)[:, :, 0] for k, v in xp.items() if k != NUMBER}
    grouped = by_prompt(scores)
    metrics = eval_metrics(rewards, greedy, grouped[:, :, 0, :-1], replace(ev, samples=0))
    correct, answers = grouped[:, :, 1:, ev.correct], grouped[:, :, 1:, -1]
    right = correct >= 1
    for k in ks(n):
        metrics[f"pass@{k}"] = _rate(pass_at_k(right, k), correct)
        metrics[f"maj@{k}"] = _rate(majority_right(answers, right, k).astype(jnp.float32), correct)
    return metrics
