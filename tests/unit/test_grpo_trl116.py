"""GRPO where TRL 1.16 differs from earlier TRL, its cispo and sapo losses and the sampler/trainer
mismatch correction, against hand computations from TRL 1.16 GRPOTrainer's formulas (written from
the formulas, not from the code): the bias-corrected KL, dapo's generation-batch normaliser, the
metrics as logged, a bfloat16 sampler's tokens masked for a float32 trainer."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stack.algorithms.grpo import GRPO
from stack.algorithms.onpolicy import completion_logps
from stack.algorithms.rlmath import overlong_penalty, reinforce_pp_advantages, rloo_advantages
from stack.config.validate import validate
from stack.errors import ConfigError
from stack.models.init import init_model
from stack.rollout import Sampling, generate
from tests.helpers import loss_of, make_cfg
from tests.unit.test_grpo import BATCH, LOGP, Rewards, Scores
from tests.unit.test_llama import tiny_cfg

A = np.array([1.0, -2.0])
MASK = np.array([[1, 1, 0], [1, 1, 1]], np.float32)
ON_POLICY = {**{k: v for k, v in BATCH.items() if k != "old_logps"}, "sampler_logps": np.array(LOGP, np.float32)}
RHO = np.exp(np.array(LOGP) - BATCH["old_logps"])  # [[1, e^0.2, 1], [e^0.3, 1, e^-0.3]]


def grad_of(grpo: GRPO, batch: dict, logps=LOGP) -> np.ndarray:
    """d loss / d log π of each token, the policy's log-probs as the variable."""
    return np.asarray(jax.grad(lambda lp: loss_of(grpo, Scores(lp), batch)[0])(jnp.asarray(logps, jnp.float32)))


def test_bias_corrected_kl_changes_the_on_policy_gradient_by_beta_kl_over_tokens():
    """TRL 1.16 use_bias_correction_kl (default): per-token β·ρ·k3. On-policy (old = sg(log π), ρ = 1)
    the value is k3's, but d(ρ·k3)/d log π = k3 + (1 − e^d) = −d with d = log π_ref − log π: the k1
    gradient, β·k3 more than without the correction. dapo over the 5 real tokens, A = (1, −2)."""
    beta, d = 0.04, -0.3
    on_policy = ON_POLICY
    batch = {**on_policy, "ref_logps": np.array(LOGP, np.float32) + d}
    k3 = math.exp(d) - d - 1
    corrected = GRPO(beta=beta, max_new_tokens=3)
    plain = GRPO(beta=beta, max_new_tokens=3, use_bias_correction_kl=False)
    loss, m = loss_of(corrected, Scores(LOGP), batch)
    assert float(loss) == pytest.approx((-2 * 1 - 3 * -2) / 5 + beta * k3, rel=1e-5)  # ρ = 1: the value is k3's
    assert float(m["kl"]) == pytest.approx(k3, rel=1e-5)
    want_plain = (-A[:, None] + beta * (1 - math.exp(d))) / 5 * MASK
    np.testing.assert_allclose(grad_of(plain, batch), want_plain, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad_of(corrected, batch), (-A[:, None] - beta * d) / 5 * MASK, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad_of(corrected, batch) - grad_of(plain, batch), beta * k3 / 5 * MASK, rtol=1e-4)


def test_bias_corrected_kl_off_policy_is_the_ratio_times_k3():
    ref = np.array(LOGP, np.float32) - 0.1
    _, m = loss_of(GRPO(beta=0.5, max_new_tokens=3), Scores(LOGP), {**BATCH, "ref_logps": ref})
    k3 = math.exp(-0.1) + 0.1 - 1
    assert float(m["kl"]) == pytest.approx((RHO * MASK).sum() * k3 / 5, rel=1e-5)


def test_finalize_carries_the_generation_batchs_tokens_and_dapo_divides_a_step_by_them():
    """TRL 1.16 dapo: normaliser = num_items_in_batch (the generation batch's loss tokens) ×
    accumulation / steps_per_generation. Rows of 2 and 3 tokens, steps_per_generation = 2: the
    step with row 0 alone divides by 5 / 2, not by its own 2 tokens."""
    grpo = GRPO(num_generations=2, max_new_tokens=3, steps_per_generation=2, epsilon=0.2)
    grpo.rewards = Rewards()
    xp = {"completion_mask": jnp.asarray(BATCH["completion_mask"])[None], "truncated": jnp.zeros((1, 2), bool),
          "sampler_logps": jnp.zeros((1, 2, 3))}
    out, _, _ = grpo.finalize(xp, jnp.asarray([[[1.0, 0.0], [0.0, 0.0]]]), ())
    np.testing.assert_allclose(np.asarray(out["row_tokens"]), [[2.5, 2.5]])
    first = {k: v[:1] for k, v in BATCH.items()} | {"row_tokens": np.asarray(out["row_tokens"])[0, :1]}
    assert float(loss_of(grpo, Scores(LOGP[:1]), first)[0]) == pytest.approx((-1.0 - 1.2) / 2.5, rel=1e-6)


def test_cispo_by_hand():
    """TRL loss_type=cispo: −sg(min(ρ, ε_max))·A·log π per token, dapo's normaliser; ε_max = 1.1.
    cispo_clip_ratio: ρ > ε_max with A > 0 (sequence 0's second token), of 5 tokens."""
    w = np.minimum(RHO, 1.1)
    per_token = -w * A[:, None] * np.array(LOGP) * MASK
    grpo = GRPO(loss_type="cispo", epsilon=0.2, epsilon_high=1.1, max_new_tokens=3)
    loss, m = loss_of(grpo, Scores(LOGP), BATCH)
    assert float(loss) == pytest.approx(per_token.sum() / 5, rel=1e-5)
    assert float(m["cispo_clip_ratio"]) == pytest.approx(1 / 5) and "clip_ratio/low_mean" not in m
    np.testing.assert_allclose(grad_of(grpo, BATCH), -w * A[:, None] / 5 * MASK, rtol=1e-5, atol=1e-7)  # w: no grad


def test_sapo_by_hand():
    """TRL loss_type=sapo: −σ(τ(ρ − 1))·4/τ·A, τ = 1.0 (A > 0) or 1.05; grpo's aggregation (each
    sequence's token mean, then the mean). On-policy its gradient is the plain −A per token."""
    tau = np.where(A > 0, 1.0, 1.05)[:, None]
    per_token = -1 / (1 + np.exp(-tau * (RHO - 1))) * 4 / tau * A[:, None] * MASK
    loss, m = loss_of(GRPO(loss_type="sapo", max_new_tokens=3), Scores(LOGP), BATCH)
    assert float(loss) == pytest.approx((per_token[0].sum() / 2 + per_token[1].sum() / 3) / 2, rel=1e-5)
    assert not any(k.startswith("clip_ratio") for k in m)
    on_policy = ON_POLICY
    want = -A[:, None] / np.array([[2.0], [3.0]]) / 2 * MASK
    np.testing.assert_allclose(grad_of(GRPO(loss_type="sapo", max_new_tokens=3), on_policy), want, rtol=1e-5)


def test_clip_min_and_max_over_sequences():
    """TRL clip_ratio/low_min and /high_max: each sequence's masked mean of its clip indicator, then
    the min (max) over sequences: low: sequence 0 none, sequence 1 1 of 3; high: 1 of 2 and none."""
    _, m = loss_of(GRPO(epsilon=0.2, max_new_tokens=3), Scores(LOGP), BATCH)
    assert float(m["clip_ratio/low_min"]) == 0.0 and float(m["clip_ratio/high_max"]) == pytest.approx(0.5)


def test_reward_and_completion_metrics_as_trl_logs_them():
    """reward_std: the batch's unbiased std; rewards/<fn>/std; frac_reward_zero_std with
    scale_rewards=batch tests the batch std (not zero here: 0); completion lengths, all and of the
    ones that ended (the truncated row's 3 tokens left out)."""
    grpo = GRPO(num_generations=2, scale_rewards="batch")
    grpo.rewards = Rewards()
    scores = jnp.asarray([[[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [1.0, 0.0]]])  # weighted: 1.5, 0, 1, 1
    mask = jnp.asarray([[[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 0]]])
    xp = {"completion_mask": mask, "truncated": jnp.asarray([[True, False, False, False]]),
          "sampler_logps": jnp.zeros((1, 4, 3))}
    _, _, m = grpo.finalize(xp, scores, ())
    assert float(m["reward_std"]) == pytest.approx(np.std([1.5, 0, 1, 1], ddof=1), rel=1e-6)
    assert float(m["rewards/accuracy/std"]) == pytest.approx(np.std([1, 0, 1, 1], ddof=1), rel=1e-6)
    assert float(m["frac_reward_zero_std"]) == 0.0  # group (1, 1) has std 0, the batch does not
    assert [float(m[f"completions/{k}"]) for k in ("mean_length", "min_length", "max_length")] == [2.0, 1.0, 3.0]
    assert [float(m[f"completions/{k}_terminated_length"]) for k in ("mean", "min", "max")] == pytest.approx(
        [5 / 3, 1.0, 2.0])


def test_cispo_without_its_cap_is_refused():
    with pytest.raises(ConfigError, match=r"loss_type=cispo caps .*epsilon_high.* None; .*epsilon_high=5\.0"):
        validate(make_cfg(["data=jsonl_prompts", "algorithm=grpo", "algorithm.loss_type=cispo"]))


def is_reference(old, sampler, mask, mode, cap, floor=None):
    """NumPy, from TRL GRPOTrainer's vllm_importance_sampling_* (a sequence's ratio: the mean log-ratio, #5814)."""
    diff = np.nan_to_num((old - sampler) * mask)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdims=True) / np.maximum(mask.sum(-1, keepdims=True), 1)
    ratio = np.exp(diff)
    low, high = -np.inf if floor is None else floor, np.inf if cap is None else cap
    if mode.endswith("truncate"):
        return np.clip(ratio, low, high)
    return np.where((ratio < low) | (ratio > high), 0, ratio)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_mismatch_correction_by_hand(mode):
    """Sampler log-probs off the trainer's by ±0.1 and a NaN (unscored: ratio 1); cap 1.05 and floor
    0.95 engage the clip or the mask. The surrogate (dapo, ρ = π/π_old) times the weight, NumPy."""
    sampler = BATCH["old_logps"] + np.array([[0.1, -0.1, 0.0], [np.nan, 0.02, -0.1]], np.float32)
    grpo = GRPO(epsilon=0.2, max_new_tokens=3, is_correction=mode, is_cap=1.05, is_floor=0.95)
    loss, m = loss_of(grpo, Scores(LOGP), {**BATCH, "sampler_logps": sampler})
    weight = is_reference(BATCH["old_logps"], sampler, MASK, mode, 1.05, 0.95)
    surrogate = -np.minimum(RHO * A[:, None], np.clip(RHO, 0.8, 1.2) * A[:, None])
    assert float(loss) == pytest.approx((surrogate * weight * MASK).sum() / 5, rel=1e-5)
    flat = weight.ravel() if mode.startswith("sequence") else weight[MASK > 0]
    assert float(m["sampling/importance_sampling_ratio/max"]) == pytest.approx(flat.max(), rel=1e-6)
    assert float(m["sampling/importance_sampling_ratio/min"]) == pytest.approx(flat.min(), rel=1e-6)
    assert float(m["sampling/importance_sampling_ratio/mean"]) == pytest.approx(flat.mean(), rel=1e-6)
    assert float(m["sampling/is_masked_fraction"]) == pytest.approx(
        np.mean(flat == 0) if mode.endswith("mask") else 0.0)


def test_a_bf16_sampler_engages_the_correction_of_an_fp32_trainer():
    """A real mismatch: completions sampled by the model computing in bfloat16, trained in float32
    (same weights). token_mask at cap 1.002 masks the tokens whose bf16 log-prob is off by more
    than log 1.002; the loss equals the NumPy reference built from the two forwards' log-probs."""
    fp32 = init_model(tiny_cfg(init_std=0.3), 0)
    bf16 = init_model(tiny_cfg(init_std=0.3, dtype="bfloat16"), 0)
    nnx.update(bf16, nnx.state(fp32, nnx.Param))  # the same weights, computing in bfloat16
    prompts, keys = jnp.ones((4, 3), jnp.int32), jax.random.split(jax.random.key(1), 4)
    out = generate(bf16, prompts, jnp.ones((4, 3), jnp.int32), keys, Sampling(max_new_tokens=6))
    xp = {"prompt_ids": prompts, "prompt_mask": jnp.ones((4, 3), jnp.int32), "completion": out.tokens,
          "completion_mask": out.mask, "sampler_logps": out.logps, "advantages": jnp.asarray([1.0, -1.0, 0.5, -0.5])}
    trainer = np.asarray(completion_logps(fp32, xp, 1.0)[0])
    mask = np.asarray(out.mask, np.float32)
    weight = is_reference(trainer, np.asarray(out.logps), mask, "token_mask", 1.002)
    assert 0 < (weight[mask > 0] == 0).mean() < 1, "bf16 sampling should leave some tokens off by > 0.2%"
    grpo = GRPO(max_new_tokens=6, is_correction="token_mask", is_cap=1.002)
    loss, m = loss_of(grpo, fp32, xp)
    adv = np.asarray(xp["advantages"])[:, None]
    assert float(loss) == pytest.approx((-adv * weight * mask).sum() / mask.sum(), rel=1e-4)  # on-policy: ρ = 1
    assert float(m["sampling/is_masked_fraction"]) == pytest.approx((weight[mask > 0] == 0).mean(), rel=1e-6)


def test_rloo_leaves_each_completion_out_of_its_baseline():
    """TRL RLOOTrainer: A_i = r_i − mean of the other scorable rewards of its group; a NaN gets 0.
    Group (1, 0, 0, 1): ±2/3; group (0.5, NaN, 0.5, 1): 0.5 − (0.5 + 1) / 2 = −0.25, 1 − 0.5 = 0.5."""
    rewards = jnp.asarray([[1.0, 0.0, 0.0, 1.0, 0.5, np.nan, 0.5, 1.0]])
    want = np.array([2 / 3, -2 / 3, -2 / 3, 2 / 3, -0.25, 0.0, -0.25, 0.5])
    np.testing.assert_allclose(np.asarray(rloo_advantages(rewards, 4))[0], want, rtol=1e-6, atol=1e-7)
    valid = want[[0, 1, 2, 3, 4, 6, 7]]  # normalize_advantages: over the scorable ones, unbiased std
    scaled = (want - valid.mean()) / (valid.std(ddof=1) + 1e-4)
    scaled[5] = 0.0
    np.testing.assert_allclose(np.asarray(rloo_advantages(rewards, 4, normalize=True))[0], scaled, rtol=1e-5)


def test_reinforce_pp_returns_with_the_kl_in_the_reward_whitened_over_the_batchs_tokens():
    """REINFORCE++ (γ = 1): row 0 (score 1) pays β·KL = 0.05, 0.1 on its 2 tokens, so its returns are
    0.85, 0.9; row 1 (score 0) pays 0, 0.15, 0.05: returns −0.2, −0.2, −0.05. Whitened over the 5
    real tokens with their mean and unbiased variance (the padded token's KL of 9 plays no part)."""
    kl = jnp.asarray([[0.1, 0.2, 9.0], [0.0, 0.3, 0.1]])
    adv = np.asarray(reinforce_pp_advantages(jnp.asarray([1.0, 0.0]), jnp.asarray(MASK), kl, beta=0.5))
    returns = np.array([0.85, 0.9, -0.2, -0.2, -0.05])
    whitened = (returns - returns.mean()) / np.sqrt(returns.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(adv[MASK > 0], whitened, rtol=1e-5)
    assert adv[0, 2] == 0.0


def test_grpo_with_reinforce_pp_takes_the_kl_into_the_reward_not_the_loss():
    grpo = GRPO(num_generations=2, max_new_tokens=3, beta=0.5, advantage="reinforce_pp", scale_rewards="none")
    grpo.rewards = Rewards()
    old = jnp.asarray(BATCH["old_logps"])[None]
    xp = {"completion_mask": jnp.asarray(BATCH["completion_mask"])[None], "truncated": jnp.zeros((1, 2), bool),
          "sampler_logps": old, "old_logps": old, "ref_logps": old - 0.1}
    out, _, m = grpo.finalize(xp, jnp.asarray([[[1.0, 0.0], [0.0, 0.0]]]), ())
    want = reinforce_pp_advantages(jnp.asarray([1.0, 0.0]), jnp.asarray(MASK), jnp.full((2, 3), 0.1), beta=0.5)
    np.testing.assert_allclose(np.asarray(out["advantages"])[0], np.asarray(want), rtol=1e-5, atol=1e-6)
    assert float(m["kl"]) == pytest.approx(0.1, rel=1e-5)  # k1 of the sampling policy
    batch = {**BATCH, "advantages": np.asarray(out["advantages"])[0], "ref_logps": np.zeros((2, 3), np.float32)}
    _, lm = loss_of(grpo, Scores(LOGP), batch)
    assert "kl" not in lm  # no β·KL term in the loss


@pytest.mark.parametrize("overrides, match", [
    (["algorithm.advantage=rloo"], "advantage=rloo with algorithm.scale_rewards=group"),
    (["algorithm.advantage=reinforce_pp", "algorithm.scale_rewards=batch"], "set algorithm.scale_rewards=none"),
    (["algorithm.is_correction=token_mask", "algorithm.is_cap=0.5", "algorithm.is_floor=0.9"], "is_cap'=0.5"),
])
def test_bad_advantage_and_correction_settings_are_refused(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(make_cfg(["data=jsonl_prompts", "algorithm=grpo", *overrides]))


def test_soft_overlong_punishment_by_hand():
    """DAPO / TRL get_soft_overlong_punishment(max 8, cache 4): lengths <= 4 get 0, 5..8 get
    (4 − L) / 4, i.e. −0.25 .. −1. Added to the reward times overlong_factor before the advantages;
    `reward` logs the sum (TRL: the punishment is one more reward function)."""
    np.testing.assert_allclose(np.asarray(overlong_penalty(jnp.arange(1, 9), 8, 4)),
                               [0, 0, 0, 0, -0.25, -0.5, -0.75, -1.0])
    grpo = GRPO(num_generations=2, max_new_tokens=8, overlong_interval=4, overlong_factor=0.5)
    grpo.rewards = Rewards()
    mask = jnp.asarray([[[1] * 3 + [0] * 5, [1] * 8, [1] * 6 + [0] * 2, [1] * 2 + [0] * 6]])
    xp = {"completion_mask": mask, "truncated": jnp.asarray([[False, True, False, False]]),
          "sampler_logps": jnp.zeros((1, 4, 8))}
    out, _, m = grpo.finalize(xp, jnp.asarray([[[1.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]]), ())
    rewards = np.array([1.0, 1.0 - 0.5, 0.0 - 0.5 * 0.5, 0.0])  # lengths 3, 8, 6, 2
    assert float(m["reward"]) == pytest.approx(rewards.mean())
    assert float(m["overlong_penalty"]) == pytest.approx((-0.5 - 0.25) / 4)
    group = lambda r: (r - r.mean()) / (np.std(r, ddof=1) + 1e-4)  # noqa: E731
    np.testing.assert_allclose(np.asarray(out["advantages"])[0], [*group(rewards[:2]), *group(rewards[2:])], rtol=1e-5)
