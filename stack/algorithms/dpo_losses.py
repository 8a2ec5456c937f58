"""DPO's per-pair losses: pure functions of sequence log-probs (formulas of TRL DPOTrainer 1.16).

Inputs (`Pairs`, all [B]): log π(c), log π(r), log π_ref(c), log π_ref(r), SUMS of the completion
tokens' log-probs, and each completion's token count n_c, n_r (for the length-normalised losses,
max(n, 1) as TRL's `clamp(min=1)`). Notation: β = `beta`, ε = `label_smoothing`,
  c = log π(c) − log π_ref(c), r = log π(r) − log π_ref(r)   (the raw log-ratios),
  Δ = f(c) − f(r)  (f: `f_divergence_type`, below; reverse_kl computes Δ as
      (log π(c) − log π(r)) − (log π_ref(c) − log π_ref(r)), the same number, in the order used before),
  Δ̄ = f(c)/n_c − f(r)/n_r  (length-normalised),  σ the logistic function.
Loss types (TRL DPOTrainer 1.16, `_compute_loss`, loss_type=…):
  sigmoid       −log σ(βΔ); with ε (cDPO, this stack's default): −(1−ε) log σ(βΔ) − ε log σ(−βΔ);
                with `trl_compat` ε is ignored, as TRL 1.16 does
  hinge         max(0, 1 − βΔ)
  ipo           (Δ̄ − 1/(2β))²
  robust        (−(1−ε) log σ(βΔ) + ε log σ(−βΔ)) / (1 − 2ε)
  exo_pair      σ(βΔ)(log σ(βΔ) − log(1−ε)) + σ(−βΔ)(log σ(−βΔ) − log ε); needs ε > 0
  nca_pair      −log σ(βc) − ½ log σ(−βc) − ½ log σ(−βr)
  bco_pair      −log σ(βc) − log σ(−βr)  (TRL 1.x: no running-mean shift δ; TRL ≤ 0.28 had one)
  sppo_hard     (c − 1/(2β))² + (r + 1/(2β))²
  aot           d = sort(log π(c) − log π(r)) − sort(log π_ref(c) − log π_ref(r)), each ascending over
                the micro-batch's pairs (all devices'; TRL: one device's), −(1−ε) log σ(βd) − ε log σ(−βd)
  aot_unpaired  d = sort(c) − sort(r), the same form
  apo_zero      (1 − σ(βc)) + σ(βr)
  apo_down      σ(βc) + (1 − σ(β(c − r)))
  discopop      x = βΔ, m = σ(x/τ) (τ = `discopop_tau`): −log σ(x)(1 − m) + exp(−x) m
  sigmoid_norm  −log σ(βΔ̄)
  sft           not a pair loss: the chosen tokens' mean NLL, a term of its own (stack.algorithms.dpo)
f-divergences (TRL's `f_divergence_type`, f'(u) of the f-DPO paper at u = π/π_ref, x = log u):
  reverse_kl x;  forward_kl 1 − e^(−x);  js_divergence log 2 + log σ(x);
  alpha_divergence (e^(min((α−1)x, 80)) − 1)/(α−1), α = `f_alpha_divergence_coef` (x when |α−1| < 1e-6).
Only the losses of Δ / Δ̄ take a non-default f (`DPOConfig.f_divergence_losses`), as TRL.
Source: trl 1.16.0 from PyPI, trl/trainer/dpo_trainer.py `DPOTrainer._compute_loss` (formulas carried
over, not code); the loss of a list of types is Σ_i loss_weights_i × mean loss_i (`pair_losses`).
"""

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp

from stack.config.schema.algorithm import DPOConfig

ls = jax.nn.log_sigmoid


class Pairs(NamedTuple):
    """Per-pair sequence log-probs (sums over completion tokens) and completion token counts, [B] each."""

    chosen: jax.Array
    rejected: jax.Array
    ref_chosen: jax.Array
    ref_rejected: jax.Array
    chosen_tokens: jax.Array
    rejected_tokens: jax.Array


class LossParams(NamedTuple):
    """The scalar settings of the losses (Python values: static under jit)."""

    beta: float = 0.1
    label_smoothing: float = 0.0
    discopop_tau: float = 0.05
    f_divergence_type: str = "reverse_kl"
    f_alpha_divergence_coef: float = 0.5
    trl_compat: bool = False


def f_score(x: jax.Array, p: LossParams) -> jax.Array:
    """f'(u) at log u = x for `p.f_divergence_type` (TRL DPOTrainer 1.16, f-DPO scores)."""
    kind, alpha = p.f_divergence_type, p.f_alpha_divergence_coef
    if kind == "forward_kl":
        return 1 - jnp.exp(-x)
    if kind == "js_divergence":
        return math.log(2) + ls(x)
    if kind == "alpha_divergence" and abs(alpha - 1.0) >= 1e-6:
        return (jnp.exp(jnp.minimum((alpha - 1.0) * x, 80.0)) - 1.0) * (1.0 / (alpha - 1.0))
    if kind in ("reverse_kl", "alpha_divergence"):
        return x
    raise ValueError(f"unknown f_divergence_type {kind!r}; one of {DPOConfig.f_divergence_types}")


def log_ratios(x: Pairs) -> tuple[jax.Array, jax.Array]:
    """(c, r): log π(c) − log π_ref(c), log π(r) − log π_ref(r)."""
    return x.chosen - x.ref_chosen, x.rejected - x.ref_rejected


def delta(x: Pairs, p: LossParams) -> jax.Array:
    """Δ = f(c) − f(r); reverse_kl: (log π(c) − log π(r)) − (log π_ref(c) − log π_ref(r)), as before."""
    if p.f_divergence_type == "reverse_kl":
        return (x.chosen - x.rejected) - (x.ref_chosen - x.ref_rejected)
    c, r = log_ratios(x)
    return f_score(c, p) - f_score(r, p)


def normalised_delta(x: Pairs, p: LossParams) -> jax.Array:
    """Δ̄ = f(c)/n_c − f(r)/n_r (reverse_kl: each log-prob divided by its length, then as `delta`)."""
    nc, nr = jnp.maximum(x.chosen_tokens, 1.0), jnp.maximum(x.rejected_tokens, 1.0)
    if p.f_divergence_type == "reverse_kl":
        return (x.chosen / nc - x.rejected / nr) - (x.ref_chosen / nc - x.ref_rejected / nr)
    c, r = log_ratios(x)
    return f_score(c, p) / nc - f_score(r, p) / nr


def rewards(x: Pairs, beta: float, normalised: bool = False) -> tuple[jax.Array, jax.Array]:
    """TRL's rewards/chosen, rewards/rejected per pair: βc, βr; `normalised`: each log-prob divided by its length."""
    if normalised:
        nc, nr = jnp.maximum(x.chosen_tokens, 1.0), jnp.maximum(x.rejected_tokens, 1.0)
        return beta * (x.chosen / nc - x.ref_chosen / nc), beta * (x.rejected / nr - x.ref_rejected / nr)
    return beta * (x.chosen - x.ref_chosen), beta * (x.rejected - x.ref_rejected)


def smoothed(z: jax.Array, eps: float) -> jax.Array:
    """−(1−ε) log σ(z) − ε log σ(−z) (cDPO form; ε = 0: −log σ(z))."""
    return -(1 - eps) * ls(z) - eps * ls(-z)


def sigmoid(x: Pairs, p: LossParams) -> jax.Array:
    if p.trl_compat:  # TRL 1.16: loss_type=sigmoid ignores label_smoothing
        return -ls(p.beta * delta(x, p))
    return smoothed(p.beta * delta(x, p), p.label_smoothing)


def hinge(x: Pairs, p: LossParams) -> jax.Array:
    return jax.nn.relu(1 - p.beta * delta(x, p))


def ipo(x: Pairs, p: LossParams) -> jax.Array:
    return (normalised_delta(x, p) - 1 / (2 * p.beta)) ** 2


def robust(x: Pairs, p: LossParams) -> jax.Array:
    z, eps = p.beta * delta(x, p), p.label_smoothing
    return (-(1 - eps) * ls(z) + eps * ls(-z)) / (1 - 2 * eps)


def exo_pair(x: Pairs, p: LossParams) -> jax.Array:
    eps = p.label_smoothing
    if not eps > 0:
        raise ValueError("loss_type exo_pair needs label_smoothing > 0 (the EXO paper recommends 1e-3)")
    z = p.beta * delta(x, p)
    return jax.nn.sigmoid(z) * (ls(z) - math.log1p(-eps)) + jax.nn.sigmoid(-z) * (ls(-z) - math.log(eps))


def nca_pair(x: Pairs, p: LossParams) -> jax.Array:
    c, r = log_ratios(x)
    return -ls(p.beta * c) - 0.5 * ls(-p.beta * c) - 0.5 * ls(-p.beta * r)


def bco_pair(x: Pairs, p: LossParams) -> jax.Array:
    c, r = log_ratios(x)
    return -ls(p.beta * c) - ls(-p.beta * r)


def sppo_hard(x: Pairs, p: LossParams) -> jax.Array:
    c, r = log_ratios(x)
    return (c - 0.5 / p.beta) ** 2 + (r + 0.5 / p.beta) ** 2


def aot(x: Pairs, p: LossParams) -> jax.Array:
    d = jnp.sort(x.chosen - x.rejected) - jnp.sort(x.ref_chosen - x.ref_rejected)
    return smoothed(p.beta * d, p.label_smoothing)


def aot_unpaired(x: Pairs, p: LossParams) -> jax.Array:
    c, r = log_ratios(x)
    return smoothed(p.beta * (jnp.sort(c) - jnp.sort(r)), p.label_smoothing)


def apo_zero(x: Pairs, p: LossParams) -> jax.Array:
    c, r = log_ratios(x)
    return (1 - jax.nn.sigmoid(p.beta * c)) + jax.nn.sigmoid(p.beta * r)


def apo_down(x: Pairs, p: LossParams) -> jax.Array:
    c, r = log_ratios(x)
    return jax.nn.sigmoid(p.beta * c) + (1 - jax.nn.sigmoid(p.beta * (c - r)))


def discopop(x: Pairs, p: LossParams) -> jax.Array:
    """exp(−x)·m is computed as exp(−x + log σ(x/τ)): the same number, but 0 rather than TRL's inf·0 = NaN
    when βΔ is very negative."""
    z = delta(x, p) * p.beta
    m = jax.nn.sigmoid(z / p.discopop_tau)
    return -ls(z) * (1 - m) + jnp.exp(-z + ls(z / p.discopop_tau))


def sigmoid_norm(x: Pairs, p: LossParams) -> jax.Array:
    return -ls(p.beta * normalised_delta(x, p))


LOSSES: dict[str, Callable[[Pairs, LossParams], jax.Array]] = {
    f.__name__: f for f in (sigmoid, hinge, ipo, robust, exo_pair, nca_pair, bco_pair, sppo_hard, aot,
                            aot_unpaired, apo_zero, apo_down, discopop, sigmoid_norm)}
assert set(LOSSES) | {"sft"} == set(DPOConfig.loss_types)


def pair_losses(x: Pairs, p: LossParams, loss_types: Sequence[str],
                weights: Sequence[float] | None = None) -> jax.Array:
    """Σ_i weight_i × loss_i per pair [B] (TRL 1.x: loss = Σ_i weight_i × mean loss_i; weights 1 each
    by default). `sft` entries are skipped: the caller adds that term (DPO.loss)."""
    weights = [1.0] * len(loss_types) if weights is None else list(weights)
    if len(weights) != len(loss_types):
        raise ValueError(f"{len(weights)} loss weights for {len(loss_types)} loss types {list(loss_types)}")
    total = None
    for name, weight in zip(loss_types, weights, strict=True):
        if name == "sft":
            continue
        if name not in LOSSES:
            raise ValueError(f"unknown DPO loss_type {name!r}; one of {DPOConfig.loss_types}")
        if p.f_divergence_type != "reverse_kl" and name not in DPOConfig.f_divergence_losses:
            raise ValueError(f"f_divergence_type {p.f_divergence_type!r} does not apply to loss_type {name!r}")
        term = LOSSES[name](x, p)
        term = term if weight == 1.0 else weight * term
        total = term if total is None else total + term
    return jnp.zeros_like(x.chosen) if total is None else total
