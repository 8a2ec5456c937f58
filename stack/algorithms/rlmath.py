"""Shared math of the on-policy algorithms: KL estimators, masked statistics, group-relative
advantages and the clipped surrogate, with the conventions of TRL's GRPOTrainer (1.x)."""

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
        ok = ~jnp.isnan(rewards)
        count = ok.sum()
        batch_mean = jnp.where(ok, rewards, 0.0).sum() / jnp.maximum(count, 1)
        batch_var = jnp.where(ok, (rewards - batch_mean) ** 2, 0.0).sum() / jnp.maximum(count - 1, 1)
        adv = centred / (jnp.sqrt(batch_var) + eps)
    elif scale == "none":
        adv = centred
    else:
        raise ValueError(f"unknown scale_rewards {scale!r}; one of group, batch, none")
    return adv.reshape(rewards.shape), std[..., 0]


def clipped_surrogate(logp: Array, old_logp: Array, advantages: Array, eps_low: float,
                      eps_high: float) -> tuple[Array, dict[str, Array]]:
    """Per-token −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A), ρ = exp(log π − log π_old), and the
    clipping indicators of TRL (`low`: ρ < 1−ε with A < 0; `high`: ρ > 1+ε_high with A > 0)."""
    ratio = jnp.exp(logp - old_logp)
    clipped = jnp.clip(ratio, 1 - eps_low, 1 + eps_high)
    loss = -jnp.minimum(ratio * advantages, clipped * advantages)
    low = (ratio < 1 - eps_low) & (advantages < 0)
    high = (ratio > 1 + eps_high) & (advantages > 0)
    return loss, {"low": low, "high": high, "region": low | high, "ratio": ratio}
