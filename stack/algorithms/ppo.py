"""Proximal Policy Optimization for language models, with the conventions of TRL's PPOTrainer
(its last releases, 0.2x) and OpenRLHF where TRL is silent or differs on purpose.

- Models: the policy; a value model (`value`: a scalar head on its own trunk, a copy of the
  initial policy, or with `shared_trunk` on the policy's hidden states; with LoRA the trunk is
  shared so the adapters and the head are the only trained params); the frozen reference
  (stack.algorithms.reference: with LoRA the base with adapters off); the score from rule
  functions on the host (reward=rules), a reward model on device (reward=model), or both, their
  weighted sum (stack.algorithms.onpolicy.scored_rewards).
- A round samples one completion per prompt (stack.rollout, `temperature`), then runs the
  training forward of the policy (old log-probs, logits / temperature as TRL), the reference
  and the value model over prompt + completion. The value at completion token t is the value
  of the state before it (the hidden state that predicts t). Everything after EOS is masked;
  EOS itself is a real token.
- Per-token reward: −kl_coef · KL_t (KL_t of the old policy vs the reference: `k1` = log π −
  log π_ref, or `k3`), plus the score on the last real token (OpenRLHF; TRL puts it one past
  the end when there is room). `missing_eos_penalty` is subtracted from the score of a
  completion that ends without EOS. `whiten_rewards` whitens the rewards (mean kept).
- GAE(γ, λ) over the completion tokens, bootstrapping 0 after the last; returns = advantages +
  values, taken before the advantages are whitened (mean/unbiased variance over real tokens).
- Loss per minibatch: the clipped surrogate (`cliprange`) token mean plus `vf_coef` × the
  clipped value loss ½ max((V − R)², (clip(V, V_old ± cliprange_value) − R)²) token mean; V_old
  are the rollout's values. Means run over the real tokens of the whole minibatch (TRL: of
  each micro-batch); the value loss uses the completion mask (TRL: one more position).
- KL control: fixed, or adaptive (Ziegler et al. 2019; TRL's AdaptiveKLController) updated
  once per round from the round's mean sequence KL with n = rollouts of the round; the
  coefficient is algorithm state, so it is checkpointed.
- Schedule: `num_ppo_epochs` passes × `num_mini_batches` minibatches per round, the rollouts
  drawn into minibatches by a new permutation each epoch (TRL: `np.random.permutation` per epoch).
- Metrics (TRL's names): objective/{kl,entropy,non_score_reward,rlhf_reward,scores},
  policy/{approxkl_avg,clipfrac_avg,entropy_avg}, loss/{policy_avg,value_avg},
  val/{clipfrac_avg,ratio,num_eos_tokens}, kl_coef, reward (mean raw score); `eps` (episodes, i.e.
  sampled completions, per second over the logging window) comes from the trainer's Throughput hook.
  Eval: greedy completions, `eval/reward`.
"""

import math
from dataclasses import replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stack.algorithms.base import Batch, Context, Metrics, Schedule, Setup, Terms, map_micro
from stack.algorithms.onpolicy import (
    PROMPT_KEYS,
    completion_features,
    completion_logps,
    host_rules,
    reward_model,
    rollout,
    scored_rewards,
    with_model_scores,
)
from stack.algorithms.reference import Reference
from stack.algorithms.rlmath import (
    adaptive_kl_coef,
    clipped_surrogate,
    clipped_value_loss,
    gae,
    kl_estimate,
    masked_mean,
    masked_whiten,
)
from stack.algorithms.sampled_eval import eval_collect, eval_metrics, eval_sampling, host_scores, host_scores_spec
from stack.config.schema.rlhf import PPOConfig
from stack.data.tokenizers import stop_ids
from stack.errors import ConfigError
from stack.models.heads import Critic, make_head
from stack.models.modules import copy_module
from stack.rollout import Sampling, paging_of


def rewards_per_token(
    kl: jax.Array, score: jax.Array, mask: jax.Array, kl_coef: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """(rewards, non-score rewards) [B, N]: −kl_coef · KL on real tokens, the score added on the last."""
    non_score = -kl_coef * kl * mask
    last = jnp.maximum(mask.sum(-1).astype(jnp.int32) - 1, 0)
    return non_score + jax.nn.one_hot(last, mask.shape[-1]) * score[:, None], non_score


class PPO:
    data_kinds = PPOConfig.data_kinds
    precomputes = False
    keep = interact = None

    def __init__(self, name: str = "ppo", max_new_tokens: int = 8, temperature: float = 0.7, kl_coef: float = 0.05,
                 kl_estimator: str = "k1", adaptive_kl: bool = False, target_kl: float = 6.0,
                 horizon: float = 10000.0, missing_eos_penalty: float | None = None, gamma: float = 1.0,
                 lam: float = 0.95, whiten_rewards: bool = False, cliprange: float = 0.2,
                 cliprange_value: float = 0.2, vf_coef: float = 0.1, num_ppo_epochs: int = 4,
                 num_mini_batches: int = 1, shared_trunk: bool | None = None,
                 reference: dict[str, Any] | None = None):
        self.name, self.temperature, self.kl_coef, self.kl_estimator = name, temperature, kl_coef, kl_estimator
        self.adaptive = (target_kl, horizon) if adaptive_kl else None
        self.eos_penalty, self.gamma, self.lam, self.whiten_rewards = missing_eos_penalty, gamma, lam, whiten_rewards
        self.cliprange, self.cliprange_value, self.vf_coef = cliprange, cliprange_value, vf_coef
        self.schedule = Schedule(num_ppo_epochs, num_mini_batches, shuffle=True)
        self.sampling = Sampling(max_new_tokens, temperature)
        self.evals = eval_sampling(None, self.sampling, None)  # setup's, with the `eval` keys
        self.shared_trunk = shared_trunk
        self.reference = Reference((reference or {}).get("init_from"))
        self.tokenizer = self.rewards = self.rows = None
        self.score, self.scores_spec = self._score, self._scores_spec  # None with a reward model alone

    def setup(self, policy: nnx.Module, ctx: Context) -> Setup:
        """The value model (trained), the reference and a reward model (frozen), the KL coefficient."""
        self.tokenizer, self.rewards, self.rows = ctx.tokenizer, ctx.rewards, ctx.rows
        self.sampling = replace(self.sampling, eos_ids=stop_ids(ctx.tokenizer), pad_id=ctx.tokenizer.pad_id,
                                paging=paging_of(ctx.rollout))
        self.evals = eval_sampling(ctx.eval, self.sampling, host_rules(ctx.rewards))
        shared = ctx.quant.base is not None if self.shared_trunk is None else self.shared_trunk
        if not shared and ctx.quant.base is not None:
            raise ConfigError("'algorithm.shared_trunk'=false with LoRA would train a full value trunk beside the "
                              "adapters; use shared_trunk=true (or null) with LoRA.")
        critic = Critic(make_head(policy, ctx.seed), None if shared else copy_module(policy))
        frozen = {**self.reference.setup(policy, ctx), **reward_model(policy, ctx)}
        if host_rules(ctx.rewards) is None:  # a reward model alone: nothing scored on the host
            self.score = self.scores_spec = None
        return Setup(trained={"value": critic}, frozen=frozen, state={"kl_coef": np.float32(self.kl_coef)})

    def values(self, models: nnx.Module, xp: Batch, features: jax.Array | None) -> jax.Array:
        """V [R, N]: the value of the state before each completion token."""
        critic = models.value
        if critic.trunk is not None:
            features = completion_features(critic.trunk, xp)
        return critic.head(features)

    def collect(self, models: nnx.Module, frozen: Any, state: Any, batch: Batch, key: jax.Array,
                train: bool) -> Batch:
        """One sampled completion per prompt with the old log-probs, the reference's and the values
        (train), or the eval's (sampled_eval); with a reward model its scores (`rm_scores`)."""
        if not train:
            return eval_collect(models.policy, frozen, batch, key, self.evals)
        rows = {k: batch[k] for k in PROMPT_KEYS}

        def one(b: Batch) -> Batch:
            xp = rollout(models.policy, b, key, jnp.zeros_like(b["index"]), self.sampling)
            logps, _, features = completion_logps(models.policy, xp, self.temperature, features=True)
            reference = self.reference.model(models, frozen)
            xp.update(old_logps=logps, ref_logps=completion_logps(reference, xp, self.temperature)[0],
                      old_values=self.values(models, xp, None if models.value.trunk is not None else features))
            return jax.lax.stop_gradient(with_model_scores(frozen, xp))

        return map_micro(one, rows)

    def _score(self, xp: Batch, host: dict[str, np.ndarray]) -> np.ndarray:
        """[n, rows, functions] rule rewards of the decoded completions (NaN: no reward)."""
        return host_scores(self.tokenizer, host_rules(self.rewards), xp, host, self.rows)

    def _scores_spec(self, xp: Batch) -> jax.ShapeDtypeStruct:
        return host_scores_spec(host_rules(self.rewards), xp)

    def scores_of(self, xp: Batch, scores: jax.Array | None) -> tuple[jax.Array, Metrics]:
        """The score per completion [n, R] (a rule reward nobody gave counts 0) and its metrics."""
        reward, metrics = scored_rewards(self.rewards, xp, scores)
        return jnp.nan_to_num(reward), metrics

    def finalize(self, xp: Batch, scores: jax.Array | None, state: Any) -> tuple[Batch, Any, Metrics]:
        """Per-token rewards, GAE advantages and returns over the whole round; the KL controller's step."""
        score, metrics = self.scores_of(xp, scores)
        if self.eos_penalty is not None:
            score = score - self.eos_penalty * xp["truncated"]
        lead = xp["completion"].shape[:2]
        flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731  [n, R, ...] -> [n·R, ...]
        mask = flat(xp["completion_mask"]).astype(jnp.float32)
        kl = kl_estimate(flat(xp["old_logps"]), flat(xp["ref_logps"]), self.kl_estimator) * mask
        rewards, non_score = rewards_per_token(kl, flat(score), mask, state["kl_coef"])
        if self.whiten_rewards:
            rewards = masked_whiten(rewards, mask, shift_mean=False) * mask
        advantages, returns = gae(rewards, flat(xp["old_values"]) * mask, mask, self.gamma, self.lam)
        advantages = masked_whiten(advantages, mask) * mask
        seq_kl, non_score_sum = kl.sum(-1).mean(), non_score.sum(-1).mean()
        metrics.update({"objective/kl": seq_kl, "objective/entropy": (-flat(xp["old_logps"]) * mask).sum(-1).mean(),
                        "objective/non_score_reward": non_score_sum, "objective/scores": score.mean(),
                        "objective/rlhf_reward": non_score_sum + score.mean(), "kl_coef": state["kl_coef"],
                        "val/num_eos_tokens": (1 - xp["truncated"]).sum().astype(jnp.float32)})
        if self.adaptive is not None:
            coef = adaptive_kl_coef(state["kl_coef"], seq_kl, *self.adaptive, mask.shape[0])
            state = {**state, "kl_coef": coef}
        unflat = lambda x: x.reshape(*lead, *x.shape[1:])  # noqa: E731
        return {**xp, "advantages": unflat(advantages), "returns": unflat(returns)}, state, metrics

    def loss(self, models: nnx.Module, batch: Batch, frozen: Any, state: Any, key: jax.Array) -> tuple[Terms, Metrics]:
        """(Σ clipped surrogate, Σ vf_coef · value loss) over real tokens, each over their count."""
        logps, entropy, features = completion_logps(models.policy, batch, self.temperature, features=True)
        vpred = self.values(models, batch, None if models.value.trunk is not None else features)
        mask = batch["completion_mask"].astype(jnp.float32)
        pg, clip = clipped_surrogate(logps - batch["old_logps"], batch["advantages"], self.cliprange, self.cliprange)
        vf, vclip = clipped_value_loss(vpred, batch["old_values"], batch["returns"], self.cliprange_value)
        tokens = mask.sum()
        num = jnp.stack([(pg * mask).sum(), self.vf_coef * (vf * mask).sum()])
        metrics = {"policy/approxkl_avg": masked_mean(0.5 * (logps - batch["old_logps"]) ** 2, mask),
                   "policy/clipfrac_avg": masked_mean(clip["region"].astype(jnp.float32), mask),
                   "policy/entropy_avg": masked_mean(entropy, mask),
                   "loss/policy_avg": masked_mean(pg, mask), "loss/value_avg": masked_mean(vf, mask),
                   "val/clipfrac_avg": masked_mean(vclip, mask), "val/ratio": masked_mean(clip["ratio"], mask)}
        return (num, jnp.stack([tokens, tokens])), jax.lax.stop_gradient(metrics)

    def evaluate(self, models: nnx.Module, xp: Batch, scores: Any, frozen: Any, state: Any) -> Metrics:
        return eval_metrics(self.rewards, xp, scores, self.evals)

    def batch_tokens(self, batch: dict[str, Any]) -> int:
        """Prompt + completion tokens; of a prompt batch, the sequences collect samples from it."""
        if "completion" in batch:
            return int(batch["prompt_ids"].size + batch["completion"].size)
        *rows, prompt = batch["prompt_ids"].shape
        return int(math.prod(rows) * (prompt + self.sampling.max_new_tokens))
