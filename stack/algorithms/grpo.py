"""Group Relative Policy Optimization with the conventions of TRL's GRPOTrainer (1.16).

- A round reads prompts and samples `num_generations` (G) completions per prompt with the
  KV-cache sampler (stack.rollout); sample keys come from the round's key, the record's
  index and the sample number. Completions stop at EOS (included in the loss mask, so
  stopping is learned) or after `max_new_tokens` (counted in `completions/clipped_ratio`).
  `top_k` / `top_p` filter the sampler only; every log-prob is of the tempered, unfiltered
  distribution (TRL GRPOTrainer: `_get_per_token_logps_and_entropies` divides by temperature).
- The old log-probs come from the training forward of the sampling policy (not from the
  decode logits), with the sampling temperature applied; `logprob_mismatch` logs the
  largest |Δ log p| between the two (≈ 0: the sampler and trainer agree). With one
  optimizer step per round (μ = 1, one minibatch) the policy the loss sees is the one that
  sampled, so that forward is skipped and old = stop_gradient(current), as TRL does when
  gradient accumulation covers the generation batch (`old_per_token_logps` None).
- Rewards: the `reward` group's functions on the host, summed with `reward.weights`
  skipping NaN (TRL's nansum); a completion no function scored is left out. Or, with
  `reward=model`, a trained reward model's score (TRL: a sequence-classification model as the
  reward function; here on device in collect, with the policy's tokenizer, as PPO's), alone or
  beside the functions as one more weighted column.
  `overlong_interval`: DAPO's soft overlong punishment added (TRL get_soft_overlong_punishment).
  `dynamic_sampling` (DAPO): `keep` marks the groups whose rewards differ; the trainer draws
  more generation batches until the round's batch is of them (stack.engine.trainer.refill).
- Advantages: (r − mean of the group) / (std + 1e-4), `scale_rewards` = group | batch | none;
  `advantage=rloo` (TRL RLOOTrainer's leave-one-out) or `reinforce_pp` (REINFORCE++: per-token
  returns with β·k1 KL in the reward, not the loss, whitened over the batch's tokens).
- Loss per token: −min(ρA, clip(ρ, 1−ε, 1+ε_high)A) + β·ρ·KL(π‖π_ref) (k3 by default, in the
  loss; ρ: `use_bias_correction_kl`, TRL 1.16's default); β = 0 (the default) builds no reference
  at all. `cispo`: −sg(min(ρ, ε_high))·A·log π; `sapo`: −σ(τ(ρ−1))·4/τ·A. `is_correction`
  weights it by π_old / π_sampler, truncated or masked (TRL's vllm_importance_sampling_*).
  `importance_sampling_level=sequence`
  (TRL's, GSPO): one ρ per completion, exp of its tokens' mean log-ratio; `delta` caps the
  unclipped ρ (TRL's two-sided clipping, INTELLECT-2); `top_entropy_quantile` q < 1 keeps the
  surrogate on the tokens whose entropy is at or above the (1 − q) quantile of the micro-batch's
  (TRL's, "Beyond the 80/20 rule"; the KL term and the token counts stay). `loss_type`:
  `grpo` per-sequence token mean, then the mean; `dr_grpo` token sum / (sequences ×
  max_new_tokens); `dapo` and `cispo` token sum / (tokens of the generation batch ÷
  steps_per_generation) (TRL 1.16; dapo is the default); `bnpo` token mean of each micro-batch;
  `sapo` as `grpo`.
  `mask_truncated_completions` (TRL's, from DAPO) leaves completions without EOS out of the
  loss and its token counts (not out of the advantages).
- Schedule: `num_iterations` (μ) passes × `steps_per_generation` minibatches per round.
- Metrics as TRL 1.16 logs them: reward, reward_std (over the batch), rewards/<fn>/{mean,std},
  frac_reward_zero_std (of the std the advantages divide by), kl, entropy,
  clip_ratio/{low,high,region}_mean (a sequence-level ratio's: over sequences), clip_ratio/low_min,
  clip_ratio/high_max, cispo_clip_ratio, completions/{mean,min,max}_length,
  completions/{mean,min,max}_terminated_length, completions/clipped_ratio; stack's own:
  reward/errors (completions × functions that gave NaN), logprob_mismatch.
- `env` (a multi-turn environment, stack.algorithms.multiturn): `interact` rolls the completions out on the
  host, turn by turn; collect adds the log-probs; the environment's reward is one more weighted column.
- Eval: greedy completions of the eval prompts, scored the same way (`eval/reward`), their
  `accuracy`, and with `eval.num_samples` pass@k and maj@k (stack.algorithms.sampled_eval).
"""

import math
from dataclasses import replace
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stack.algorithms.base import Batch, Context, Metrics, Schedule, Setup, Terms, map_micro
from stack.algorithms.multiturn import interaction, interaction_specs, turn_program, turn_samplings
from stack.algorithms.onpolicy import (
    PROMPT_KEYS,
    completion_logps,
    host_rules,
    mismatch,
    reward_model,
    rollout,
    scored_rewards,
    with_model_scores,
)
from stack.algorithms.reference import Reference
from stack.algorithms.rlmath import (
    cispo_surrogate,
    clipped_surrogate,
    group_advantages,
    high_entropy,
    kl_estimate,
    masked_mean,
    nanstd,
    overlong_penalty,
    reinforce_pp_advantages,
    rloo_advantages,
    sampler_weight,
    sapo_surrogate,
)
from stack.algorithms.sampled_eval import eval_collect, eval_metrics, eval_sampling, host_scores, host_scores_spec
from stack.config.schema.algorithm import GRPOConfig
from stack.data.tokenizers import stop_ids
from stack.rollout import Sampling, paging_of


class GRPO:
    data_kinds = GRPOConfig.data_kinds
    precomputes = False

    def __init__(self, name: str = "grpo", num_generations: int = 8, max_new_tokens: int = 8,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, beta: float = 0.0,
                 kl_estimator: str = "k3", use_bias_correction_kl: bool = True, epsilon: float = 0.2,
                 epsilon_high: float | None = None, sapo_temperature_pos: float = 1.0,
                 sapo_temperature_neg: float = 1.05,
                 loss_type: str = "dapo", scale_rewards: str = "group", num_iterations: int = 1,
                 steps_per_generation: int = 1, reference: dict[str, Any] | None = None,
                 mask_truncated_completions: bool = False, importance_sampling_level: str | None = None,
                 delta: float | None = None, top_entropy_quantile: float | None = None, is_correction: str = "none",
                 is_cap: float | None = 3.0, is_floor: float | None = None, advantage: str = "grpo",
                 overlong_interval: int = 0, overlong_factor: float = 1.0, dynamic_sampling: bool = False,
                 max_generation_batches: int = 4):
        self.name, self.group, self.temperature = name, num_generations, temperature
        self.beta, self.kl_estimator, self.loss_type, self.scale = beta, kl_estimator, loss_type, scale_rewards
        self.eps_low, self.eps_high = epsilon, epsilon if epsilon_high is None else epsilon_high
        self.bias_correction, self.sapo_tau = use_bias_correction_kl, (sapo_temperature_pos, sapo_temperature_neg)
        self.schedule = Schedule(num_iterations, steps_per_generation,
                                 generations=max_generation_batches if dynamic_sampling else 1)
        self.keep = self._keep if dynamic_sampling else None
        self.advantage, self.kl_in_reward = advantage, advantage == "reinforce_pp" and beta > 0
        # else old = stop_gradient(current); REINFORCE++'s KL in the reward needs the old log-probs in finalize
        self.keep_old = num_iterations * steps_per_generation > 1 or self.kl_in_reward
        self.mask_truncated = mask_truncated_completions
        self.sequence_level, self.delta = importance_sampling_level == "sequence", delta
        self.top_entropy = None if top_entropy_quantile is None or top_entropy_quantile >= 1 else top_entropy_quantile
        self.is_correction = (is_correction, is_cap, is_floor)
        self.overlong = (overlong_interval, overlong_factor)
        self.sampling = Sampling(max_new_tokens, temperature, top_k, top_p)
        self.evals = eval_sampling(None, self.sampling, None)  # setup's, with the `eval` keys
        self.reference = Reference((reference or {}).get("init_from"))
        self.tokenizer = self.rewards = self.rows = self.env = self.interact = None
        self.turns = (self.sampling, self.sampling)  # the turn program's (eval, train) sampling, with an env
        self.score, self.scores_spec = self._score, self._scores_spec  # None with a reward model alone

    def setup(self, policy: nnx.Module, ctx: Context) -> Setup:
        """The tokenizer and reward functions for scoring (or the reward model); the reference only when beta > 0."""
        self.tokenizer, self.rewards, self.rows = ctx.tokenizer, ctx.rewards, ctx.rows
        self.sampling = replace(self.sampling, eos_ids=stop_ids(ctx.tokenizer), pad_id=ctx.tokenizer.pad_id,
                                paging=paging_of(ctx.rollout))
        self.evals = eval_sampling(ctx.eval, self.sampling, host_rules(ctx.rewards))
        frozen = {**(self.reference.setup(policy, ctx) if self.beta else {}), **reward_model(policy, ctx)}
        if host_rules(ctx.rewards) is None:  # a reward model or an environment alone: nothing scored on the host
            self.score = self.scores_spec = None
        if ctx.env is not None:  # multi-turn rollouts (stack.algorithms.multiturn)
            self.env, self.interact = ctx.env, self._interact
            self.turns = turn_samplings(self.evals.greedy, self.sampling, ctx.env, ctx.tokenizer)
        return Setup(frozen=frozen)

    def _interact(self, turn: Callable[[Batch], Batch], batch: Batch, host: dict, train: bool) -> Batch:
        """The prompts' multi-turn rollouts (G per prompt; in eval the greedy one), for `collect`."""
        s = self.sampling
        return interaction(turn, batch, host, self.group if train else 1, (self.tokenizer, self.env, self.rows),
                           s.max_new_tokens, s.pad_id, s.eos_ids)

    def interaction_specs(self, batch: dict) -> tuple[dict, dict]:
        return interaction_specs(batch, self.group, self.sampling.max_new_tokens)  # mode=compile's shapes

    def turn(self, models: nnx.Module, batch: Batch, key: jax.Array, train: bool) -> Batch:
        """One model turn of multi-turn rollouts, keyed as `collect`."""
        return turn_program(models.policy, batch, key, self.turns[train])

    def collect(self, models: nnx.Module, frozen: Any, state: Any, batch: Batch, key: jax.Array,
                train: bool) -> Batch:
        """G sampled completions per prompt with old/ref log-probs (train), or the eval's (sampled_eval)."""
        rolled = "completion" in batch  # by multi-turn rollouts (`interact`): its rows are the experience
        if not train:
            return (map_micro(lambda b: with_model_scores(frozen, b), batch) if rolled
                    else eval_collect(models.policy, frozen, batch, key, self.evals))
        rows = batch if rolled else {k: jnp.repeat(batch[k], self.group, axis=1) for k in PROMPT_KEYS}
        number = jnp.tile(jnp.arange(self.group), batch["index"].shape[1])

        def one(b: Batch) -> Batch:
            xp = b if rolled else rollout(models.policy, b, key, number, self.sampling)
            if self.keep_old:
                xp["old_logps"] = completion_logps(models.policy, xp, self.temperature)[0]
            if self.beta:
                xp["ref_logps"] = completion_logps(self.reference.model(models, frozen), xp, self.temperature)[0]
            return with_model_scores(frozen, xp)

        return map_micro(one, rows)

    def _score(self, xp: Batch, host: dict[str, np.ndarray]) -> np.ndarray:
        """[n, rows, functions] rewards of the decoded completions (NaN: no reward)."""
        return host_scores(self.tokenizer, host_rules(self.rewards), xp, host, self.rows)

    def _scores_spec(self, xp: Batch) -> jax.ShapeDtypeStruct:
        return host_scores_spec(host_rules(self.rewards), xp)

    def finalize(self, xp: Batch, scores: jax.Array | None, state: Any) -> tuple[Batch, Any, Metrics]:
        """Group-relative advantages and the round's reward metrics (`scores` None: the reward model's)."""
        reward, metrics = self._rewards(xp, scores)
        advantages, std = group_advantages(reward, self.group, self.scale)
        if self.advantage != "grpo":
            advantages, kl = self._other_advantages(reward, xp)
            metrics.update({"kl": kl} if kl is not None else {})
        zero_std = nanstd(reward) if self.scale == "batch" else std  # the std TRL divides by, or tests for 0
        metrics.update({"reward_std": nanstd(reward), "frac_reward_zero_std": jnp.isclose(zero_std, 0.0).mean()})
        if "old_logps" in xp:
            metrics["logprob_mismatch"] = mismatch(xp, xp["old_logps"])
        tokens = self._mask(xp).sum(-1)  # [.., rows]: each row carries the generation batch's mean, for dapo/cispo
        return {**xp, "advantages": advantages, "row_tokens": jnp.full_like(tokens, tokens.mean())}, state, metrics

    def _rewards(self, xp: Batch, scores: jax.Array | None) -> tuple[jax.Array, Metrics]:
        """The reward per completion and its metrics (scored_rewards), with DAPO's soft overlong
        punishment added as one more term (TRL: a reward function; `reward` logs the sum)."""
        reward, metrics = scored_rewards(self.rewards, xp, scores, self.env and self.env.weight)
        if self.overlong[0]:
            lengths = xp["completion_mask"].sum(-1)
            penalty = self.overlong[1] * overlong_penalty(lengths, self.sampling.max_new_tokens, self.overlong[0])
            reward = reward + penalty
            metrics.update({"reward": jnp.nanmean(reward), "overlong_penalty": penalty.mean()})
        return reward, metrics

    def _keep(self, xp: Batch, scores: jax.Array | None) -> jax.Array:
        """DAPO's dynamic sampling: the rows of the groups whose rewards are not all equal."""
        reward = self._rewards(xp, scores)[0]
        _, std = group_advantages(reward, self.group, "none")
        return jnp.repeat(~jnp.isclose(std, 0.0), self.group, axis=-1)

    def _other_advantages(self, reward: jax.Array, xp: Batch) -> tuple[jax.Array, jax.Array | None]:
        """`advantage=rloo` (TRL RLOOTrainer's; scale_rewards=batch: its normalize_advantages) or
        `reinforce_pp` (per token, β·k1 KL in the reward) and, for the latter, the KL it subtracted."""
        if self.advantage == "rloo":
            return rloo_advantages(reward, self.group, normalize=self.scale == "batch"), None
        kl = xp["old_logps"] - xp["ref_logps"] if self.kl_in_reward else None  # k1 of the sampling policy
        mask = self._mask(xp)
        return reinforce_pp_advantages(reward, mask, kl, self.beta), None if kl is None else masked_mean(kl, mask)

    def _mask(self, xp: Batch) -> jax.Array:
        """The tokens the loss counts: the completion's, none of a truncated one's with mask_truncated_completions."""
        mask = xp["completion_mask"].astype(jnp.float32)
        if self.mask_truncated:  # TRL mask_truncated_completions (DAPO): no loss on a completion without EOS
            mask = jnp.where(xp["truncated"][..., None], 0.0, mask)
        return mask

    def loss(self, models: nnx.Module, batch: Batch, frozen: Any, state: Any, key: jax.Array) -> tuple[Terms, Metrics]:
        logps, entropy = completion_logps(models.policy, batch, self.temperature)
        mask = self._mask(batch)
        old = batch["old_logps"] if "old_logps" in batch else jax.lax.stop_gradient(logps)
        log_ratio = logps - old
        if self.sequence_level:  # TRL importance_sampling_level=sequence (GSPO): [rows, 1]
            log_ratio = (log_ratio * mask).sum(-1, keepdims=True) / jnp.maximum(mask.sum(-1, keepdims=True), 1.0)
        adv = batch["advantages"]
        per_token, metrics = self._surrogate(log_ratio, adv[:, None] if adv.ndim == 1 else adv, logps, mask)
        if self.top_entropy is not None:
            per_token = per_token * high_entropy(jax.lax.stop_gradient(entropy), mask, 1 - self.top_entropy)
        if self.is_correction[0] != "none":
            weight, is_metrics = sampler_weight(jax.lax.stop_gradient(old), batch["sampler_logps"], mask,
                                                self.is_correction)
            per_token = per_token * weight
            metrics.update(is_metrics)
        metrics["entropy"] = masked_mean(entropy, mask)
        if "old_logps" not in batch:  # the first pass over the samples: compare with the sampler here
            metrics["logprob_mismatch"] = mismatch(batch, jax.lax.stop_gradient(logps))
        if self.beta and not self.kl_in_reward:
            kl = kl_estimate(logps, batch["ref_logps"], self.kl_estimator)
            if self.bias_correction:  # TRL use_bias_correction_kl (DeepSeek-V3.2): unbiased off-policy, and a
                kl = kl * jnp.exp(log_ratio)  # gradient through the ratio even where it equals 1
            per_token = per_token + self.beta * kl
            metrics["kl"] = masked_mean(kl, mask)
        return self._aggregate(per_token * mask, mask, batch), metrics

    def _surrogate(self, log_ratio: jax.Array, adv: jax.Array, logps: jax.Array,
                   mask: jax.Array) -> tuple[jax.Array, Metrics]:
        """Per-token policy loss of `loss_type` and its clipping metrics, as TRL logs them (a sequence-level
        ratio's over sequences)."""
        if self.loss_type == "sapo":
            return sapo_surrogate(log_ratio, adv, *self.sapo_tau), {}
        over = (lambda x: x.mean()) if self.sequence_level else (lambda x: masked_mean(x, mask))  # noqa: E731
        if self.loss_type == "cispo":
            per_token, clipped = cispo_surrogate(log_ratio, adv, logps, self.eps_high)
            return per_token, {"cispo_clip_ratio": over(clipped.astype(jnp.float32))}
        per_token, clip = clipped_surrogate(log_ratio, adv, self.eps_low, self.eps_high, self.delta)
        clip = {k: clip[k].astype(jnp.float32) for k in ("low", "high", "region")}
        of_rows = (lambda v: v[:, 0]) if self.sequence_level else (lambda v: (v * mask).sum(-1) / mask.sum(-1))  # noqa: E731
        return per_token, {**{f"clip_ratio/{k}_mean": over(v) for k, v in clip.items()},
                           "clip_ratio/low_min": jnp.nanmin(of_rows(clip["low"])),  # NaN rows: no token
                           "clip_ratio/high_max": jnp.nanmax(of_rows(clip["high"]))}

    def _aggregate(self, losses: jax.Array, mask: jax.Array, batch: Batch) -> Terms:
        """(numerator, denominator) of `loss_type` over a micro-batch; summed over micro-batches."""
        if self.loss_type in ("grpo", "sapo"):
            return (losses.sum(-1) / jnp.maximum(mask.sum(-1), 1.0)).sum(), jnp.float32(losses.shape[0])
        if self.loss_type == "dr_grpo":
            return losses.sum(), jnp.float32(losses.size)  # sequences x max_new_tokens
        if self.loss_type == "bnpo":
            return losses.sum() / jnp.maximum(mask.sum(), 1.0), jnp.float32(1.0)
        # dapo, cispo (TRL 1.16): the generation batch's tokens / steps_per_generation per optimizer step; the rows
        # of a step carry its mean tokens per row (finalize). A batch not from finalize: its own tokens.
        return losses.sum(), batch["row_tokens"].sum() if "row_tokens" in batch else mask.sum()

    def evaluate(self, models: nnx.Module, xp: Batch, scores: jax.Array | None, frozen: Any, state: Any) -> Metrics:
        return eval_metrics(self.rewards, xp, scores, self.evals, self.env and self.env.weight)

    def batch_tokens(self, batch: dict[str, Any]) -> int:
        """Prompt + completion tokens; of a prompt batch, the sequences collect samples from it."""
        if "completion" in batch:
            return int(batch["prompt_ids"].size + batch["completion"].size)
        *rows, prompt = batch["prompt_ids"].shape
        return int(math.prod(rows) * self.group * (prompt + self.sampling.max_new_tokens))
