"""Shared math of the on-policy algorithms: KL estimators, masked statistics, group-relative
advantages and the clipped surrogate, with the conventions of TRL's GRPOTrainer (1.x).
PPO's GAE, whitening, clipped value loss and adaptive KL coefficient follow TRL's PPOTrainer
and Ziegler et al. 2019."""

import jax
import jax.numpy as jnp

Array = jax.Array


def kl_estimate(logp: Array, ref_logp: Array, estimator: str = "k3") -> Array:
    """Per-token KL(π ‖ π_ref) estimates from log-probs of tokens sampled from π (Schulman's k1/k2/k3).

    k1 = log π − log π_ref; k2 = ½ (log π − log π_ref)²; k3 = exp(log π_ref − log π) − (log π_ref − log π) − 1
    (TRL GRPOTrainer's `per_token_kl`: unbiased and never negative).
    """
    d = ref_logp - logp
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d**2
    if estimator == "k3":
        return jnp.exp(d) - d - 1
    raise ValueError(f"unknown KL estimator {estimator!r}; one of k1, k2, k3")


def masked_mean(x: Array, mask: Array, axis: int | None = None) -> Array:
    """Mean of `x` where `mask` (0 where nothing is masked in)."""
    mask = mask.astype(x.dtype)
    return (x * mask).sum(axis) / jnp.maximum(mask.sum(axis), 1.0)


def group_advantages(rewards: Array, group: int, scale: str = "group", eps: float = 1e-4) -> tuple[Array, Array]:
    """(advantages, std per group) of rewards [..., groups × group] (TRL GRPOTrainer).

    advantage = r − mean of its group, divided by (std + 1e-4) with `scale` = "group" (the
    group's std), "batch" (the std of all rewards) or "none". Stds are unbiased (torch.std).
    NaN rewards (no reward function answered) are left out of the statistics and get
    advantage 0; a group with one valid reward has std 0.
    """
    r = rewards.reshape(*rewards.shape[:-1], -1, group)
    valid = ~jnp.isnan(r)
    n = valid.sum(-1, keepdims=True)
    mean = jnp.where(valid, r, 0.0).sum(-1, keepdims=True) / jnp.maximum(n, 1)
    var = jnp.where(valid, (r - mean) ** 2, 0.0).sum(-1, keepdims=True) / jnp.maximum(n - 1, 1)
    std = jnp.sqrt(var)
    centred = jnp.where(valid, r - mean, 0.0)
    if scale == "group":
        adv = centred / (std + eps)
    elif scale == "batch":  # the group's mean, the whole batch's std
        adv = centred / (nanstd(rewards) + eps)
    elif scale == "none":
        adv = centred
    else:
        raise ValueError(f"unknown scale_rewards {scale!r}; one of group, batch, none")
    return adv.reshape(rewards.shape), std[..., 0]


def overlong_penalty(lengths: Array, max_len: int, interval: int) -> Array:
    """DAPO's soft overlong punishment (TRL `get_soft_overlong_punishment`): 0 up to max_len −
    interval tokens, then falling linearly to −1 at max_len, −1 beyond."""
    start = max_len - interval
    return jnp.where(lengths <= start, 0.0, jnp.maximum((start - lengths) / interval, -1.0))


def rloo_advantages(rewards: Array, group: int, normalize: bool = False, eps: float = 1e-4) -> Array:
    """r − the mean of the other valid rewards of its group (TRL RLOOTrainer's leave-one-out
    baseline over scorable siblings); with `normalize` then (A − mean) / (std + 1e-4) over the
    batch (its normalize_advantages). A NaN reward, or one alone in its group, gets 0."""
    r = rewards.reshape(*rewards.shape[:-1], -1, group)
    valid = ~jnp.isnan(r)
    n = valid.sum(-1, keepdims=True)
    others = (jnp.where(valid, r, 0.0).sum(-1, keepdims=True) - r) / jnp.maximum(n - 1, 1)
    adv = jnp.where(n > 1, r - others, jnp.nan).reshape(rewards.shape)
    if normalize:
        adv = (adv - jnp.nanmean(adv)) / (nanstd(adv) + eps)
    return jnp.nan_to_num(adv, nan=0.0)


def reinforce_pp_advantages(rewards: Array, mask: Array, kl: Array | None = None, beta: float = 0.0) -> Array:
    """Per-token REINFORCE++ advantages (Hu 2025; verl's reinforce_plus_plus, γ = 1): token rewards
    are the score at the last real token − β·KL_t (the KL in the reward), the return of a token is
    the sum of the rewards from it on, and the returns are whitened over every real token of the
    batch (masked mean and unbiased variance). A completion with a NaN reward gets 0 and no part
    in the statistics."""
    m = jnp.where(jnp.isnan(rewards)[..., None], 0.0, mask.astype(jnp.float32))
    penalty = jnp.zeros_like(m) if kl is None else beta * kl * m
    returns = jnp.nan_to_num(rewards)[..., None] - jnp.flip(jnp.cumsum(jnp.flip(penalty, -1), -1), -1)
    return masked_whiten(returns, m) * m


def clipped_surrogate(log_ratio: Array, advantages: Array, eps_low: float, eps_high: float,
                      delta: float | None = None) -> tuple[Array, dict[str, Array]]:
    """Per-token −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A), ρ = exp(log_ratio) (log π − log π_old),
    and the clipping indicators of TRL (`low`: ρ < 1−ε with A < 0; `high`: ρ > 1+ε_high with
    A > 0). `delta` caps the unclipped ρ (TRL GRPOConfig.delta: two-sided clipping, INTELLECT-2)."""
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1 - eps_low, 1 + eps_high)
    if delta is not None:
        ratio = jnp.minimum(ratio, delta)
    loss = -jnp.minimum(ratio * advantages, clipped * advantages)
    low = (ratio < 1 - eps_low) & (advantages < 0)
    high = (ratio > 1 + eps_high) & (advantages > 0)
    return loss, {"low": low, "high": high, "region": low | high, "ratio": ratio}


def cispo_surrogate(log_ratio: Array, advantages: Array, logps: Array, eps_max: float) -> tuple[Array, Array]:
    """Per-token −sg(min(ρ, ε_max))·A·log π and where ρ > ε_max with A > 0 (TRL GRPOTrainer
    loss_type=cispo, MiniMax-M1: the ratio, not the advantage-scaled ratio, is clipped, and stops
    the gradient; every token keeps the policy-gradient term)."""
    ratio = jnp.exp(log_ratio)
    weight = jax.lax.stop_gradient(jnp.minimum(ratio, eps_max))
    return -weight * advantages * logps, (ratio > eps_max) & (advantages > 0)


def sapo_surrogate(log_ratio: Array, advantages: Array, tau_pos: float, tau_neg: float) -> Array:
    """Per-token −σ(τ(ρ − 1))·4/τ·A, τ = τ_pos where A > 0 else τ_neg (TRL GRPOTrainer loss_type=sapo,
    Soft Adaptive Policy Optimization): a smooth gate instead of the clip, whose gradient at ρ = 1 is
    the plain policy gradient's."""
    tau = jnp.where(advantages > 0, tau_pos, tau_neg)
    return -jax.nn.sigmoid(tau * (jnp.exp(log_ratio) - 1)) * 4 / tau * advantages


def sampler_correction(old: Array, sampler: Array, mask: Array, mode: str, cap: float | None,
                       floor: float | None) -> tuple[Array, Array]:
    """(weight, masked) of each token for the trainer/sampler mismatch (TRL GRPOTrainer's
    vllm_importance_sampling_correction): ρ = π_old / π_sampler of each sampled token, or per
    sequence (`sequence_*`: exp of the tokens' mean log-ratio, TRL #5814) [rows, 1]; `*_truncate`
    clips ρ to [floor, cap], `*_mask` zeroes it outside. A NaN sampler log-prob counts as ρ = 1."""
    diff = jnp.nan_to_num((old - sampler) * mask)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdims=True) / jnp.maximum(mask.sum(-1, keepdims=True), 1.0)
    ratio = jax.lax.stop_gradient(jnp.exp(diff))
    low, high = -jnp.inf if floor is None else floor, jnp.inf if cap is None else cap
    if mode.endswith("truncate"):
        return jnp.clip(ratio, low, high), jnp.zeros(ratio.shape, bool)
    outside = (ratio < low) | (ratio > high)
    return jnp.where(outside, 0.0, ratio), outside


def sampler_weight(old: Array, sampler: Array, mask: Array,
                   correction: tuple[str, float | None, float | None]) -> tuple[Array, dict[str, Array]]:
    """GRPO's `is_correction` weight per token (sampler_correction of `correction` = (mode, cap, floor)) and
    TRL's `sampling/importance_sampling_ratio/*` (of the weights: over real tokens, or sequences) with
    stack's own `sampling/is_masked_fraction`."""
    weight, masked = sampler_correction(old, sampler, mask, *correction)
    where = jnp.ones(weight.shape, bool) if weight.shape[-1] == 1 else mask > 0
    stats = {"min": jnp.where(where, weight, jnp.inf).min(), "max": jnp.where(where, weight, -jnp.inf).max(),
             "mean": masked_mean(weight, where)}
    return weight, {**{f"sampling/importance_sampling_ratio/{k}": v for k, v in stats.items()},
                    "sampling/is_masked_fraction": masked_mean(masked.astype(jnp.float32), where)}


def nanstd(x: Array) -> Array:
    """The unbiased std of the non-NaN entries of `x` (TRL's `nanstd`); 0 with fewer than two."""
    ok = ~jnp.isnan(x)
    n = ok.sum()
    mean = jnp.where(ok, x, 0.0).sum() / jnp.maximum(n, 1)
    return jnp.sqrt(jnp.where(ok, (x - mean) ** 2, 0.0).sum() / jnp.maximum(n - 1, 1))


def high_entropy(entropy: Array, mask: Array, q: float) -> Array:
    """1.0 where a masked-in token's entropy is at or above the `q` quantile (linear, as
    torch.quantile) of the masked-in entropies, else 0 (TRL GRPOTrainer.get_high_entropy_mask)."""
    threshold = jnp.nanquantile(jnp.where(mask > 0, entropy, jnp.nan), q)
    return ((entropy >= threshold) & (mask > 0)).astype(entropy.dtype)


def masked_var(x: Array, mask: Array, unbiased: bool = True) -> Array:
    """Variance of `x` over the entries where `mask` (TRL `trl.core.masked_var`).

    The masked mean of the squared deviation from the masked mean, times mask_sum / (mask_sum − 1)
    when `unbiased`; with at most one entry masked in the uncorrected variance is returned.
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = mask.astype(x.dtype).sum()
        var = var * jnp.where(n > 1, n / jnp.maximum(n - 1, 1.0), 1.0)
    return var


def masked_whiten(x: Array, mask: Array, shift_mean: bool = True, eps: float = 1e-8) -> Array:
    """(x − mean) · rsqrt(var + eps), mean and unbiased var over the masked-in entries (TRL
    `trl.core.masked_whiten`); the mean is added back unless `shift_mean`. Every position gets a
    value: zeroing the masked-out ones is the caller's."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * jax.lax.rsqrt(var + eps)
    return whitened if shift_mean else whitened + mean


def gae(rewards: Array, values: Array, mask: Array, gamma: float, lam: float) -> tuple[Array, Array]:
    """(advantages, returns) by generalized advantage estimation over completion tokens [B, N]
    (TRL PPOTrainer's reversed loop).

    δ_t = r_t + γ V_{t+1} − V_t and A_t = δ_t + γλ A_{t+1}, with V after the last position 0 and
    entries where `mask` is 0 counted as reward 0 and value 0; returns = A + V (V masked).
    Advantages are 0 where `mask` is 0.
    """
    m = mask.astype(values.dtype)
    r, v = rewards * m, values * m
    next_v = jnp.concatenate([v[:, 1:], jnp.zeros_like(v[:, :1])], axis=1)
    delta = r + gamma * next_v - v

    def step(carry: Array, d: Array) -> tuple[Array, Array]:
        a = d + gamma * lam * carry
        return a, a

    _, adv_t = jax.lax.scan(step, jnp.zeros_like(delta[:, 0]), delta.T, reverse=True)
    advantages = adv_t.T * m
    return advantages, advantages + v


def clipped_value_loss(values: Array, old_values: Array, returns: Array, clip: float) -> tuple[Array, Array]:
    """Per-token ½ max((v − R)², (clip(v, v_old − c, v_old + c) − R)²) and the indicator that the
    clipped term is the larger, as float32 (TRL PPOTrainer's value loss and `vf_clipfrac`)."""
    clipped = jnp.clip(values, old_values - clip, old_values + clip)
    unclipped_loss = (values - returns) ** 2
    clipped_loss = (clipped - returns) ** 2
    return 0.5 * jnp.maximum(unclipped_loss, clipped_loss), (clipped_loss > unclipped_loss).astype(jnp.float32)


def adaptive_kl_coef(coef: Array | float, current_kl: Array | float, target: float, horizon: float,
                     n_steps: int) -> Array:
    """The KL coefficient after `n_steps` samples (Ziegler et al. 2019; TRL AdaptiveKLController.update):
    coef · (1 + e · n_steps / horizon), e = clip(current_kl / target − 1, −0.2, 0.2)."""
    err = jnp.clip(jnp.asarray(current_kl) / target - 1, -0.2, 0.2)
    return jnp.asarray(coef) * (1 + err * n_steps / horizon)
