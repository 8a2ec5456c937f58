"""The TRL 1.16 DPO loss types (stack.algorithms.dpo_losses) against NumPy transcriptions of
TRL DPOTrainer 1.16's `_compute_loss` formulas, weighted combinations, the config checks and
the `trl_compat` switch. Pure functions on fixed log-probs; no model is trained."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from omegaconf import OmegaConf

from stack.algorithms.dpo import dpo_loss
from stack.algorithms.dpo_losses import LossParams, Pairs, pair_losses
from stack.config.schema.algorithm import DPOConfig
from stack.errors import ConfigError
from tests.unit.test_dpo import hand_logps, pair_batch, run_loss

# fixed per-pair sequence log-probs (sums over completion tokens) and completion lengths
PC = np.array([-12.0, -30.5, -7.25, -20.0, -3.0])
PR = np.array([-14.0, -28.0, -9.5, -20.0, -8.0])
RC = np.array([-13.0, -29.0, -7.0, -21.5, -2.0])
RR = np.array([-12.5, -29.5, -10.0, -19.0, -9.0])
NC = np.array([4.0, 10.0, 3.0, 7.0, 0.0])  # a 0-token row: TRL clamps the length to 1
NR = np.array([5.0, 8.0, 6.0, 7.0, 2.0])
BETA, EPS, TAU = 0.3, 0.1, 0.05


def ls(x):  # log σ(x)
    return -np.logaddexp(0.0, -x)


def sg(x):  # σ(x)
    return 1 / (1 + np.exp(-x))


def f_np(x, kind, alpha=0.5):  # TRL 1.16 f-divergence scores f'(u), x = log u
    if kind == "forward_kl":
        return 1 - np.exp(-x)
    if kind == "js_divergence":
        return math.log(2) + ls(x)
    if kind == "alpha_divergence" and abs(alpha - 1) >= 1e-6:
        return (np.exp(np.minimum((alpha - 1) * x, 80.0)) - 1) / (alpha - 1)
    return x


def trl(name, kind="reverse_kl", eps=EPS, alpha=0.5):
    """Per-pair TRL 1.16 loss (NumPy, float64): chosen_logratios c, rejected_logratios r,
    delta_score = f(c) - f(r), length-normalised by completion_mask.sum().clamp(min=1)."""
    c, r = PC - RC, PR - RR
    d = f_np(c, kind, alpha) - f_np(r, kind, alpha)
    dn = f_np(c, kind, alpha) / np.maximum(NC, 1) - f_np(r, kind, alpha) / np.maximum(NR, 1)
    b = BETA
    cdpo = lambda z: -ls(z) * (1 - eps) - ls(-z) * eps  # noqa: E731 (aot, aot_unpaired)
    return {
        "sigmoid": lambda: -ls(b * d),  # TRL 1.16: no label smoothing
        "hinge": lambda: np.maximum(0, 1 - b * d),
        "ipo": lambda: (dn - 1 / (2 * b)) ** 2,
        "robust": lambda: (-(1 - eps) * ls(b * d) + eps * ls(-b * d)) / (1 - 2 * eps),
        "exo_pair": lambda: sg(b * d) * (ls(b * d) - np.log1p(-eps)) + sg(-b * d) * (ls(-b * d) - np.log(eps)),
        "nca_pair": lambda: -ls(b * c) - 0.5 * ls(-b * c) - 0.5 * ls(-b * r),
        "bco_pair": lambda: -ls(b * c) - ls(-b * r),
        "sppo_hard": lambda: (c - 0.5 / b) ** 2 + (r + 0.5 / b) ** 2,
        "aot": lambda: cdpo(b * (np.sort(PC - PR) - np.sort(RC - RR))),
        "aot_unpaired": lambda: cdpo(b * (np.sort(c) - np.sort(r))),
        "apo_zero": lambda: (1 - sg(b * c)) + sg(b * r),
        "apo_down": lambda: sg(b * c) + (1 - sg(b * (c - r))),
        "discopop": lambda: -ls(d * b) * (1 - sg(d * b / TAU)) + np.exp(-d * b) * sg(d * b / TAU),
        "sigmoid_norm": lambda: -ls(b * dn),
    }[name]()


def ours(types, weights=None, **kw):
    x = Pairs(*(jnp.asarray(a, jnp.float32) for a in (PC, PR, RC, RR, NC, NR)))
    p = LossParams(**{"beta": BETA, "label_smoothing": EPS, "discopop_tau": TAU, "trl_compat": True, **kw})
    return np.asarray(pair_losses(x, p, types, weights))


NEW = ["exo_pair", "nca_pair", "bco_pair", "sppo_hard", "aot", "aot_unpaired", "apo_zero", "apo_down", "discopop",
       "sigmoid_norm"]
F_KINDS = ["forward_kl", "js_divergence", "alpha_divergence"]


@pytest.mark.parametrize("name", NEW + ["sigmoid", "hinge", "ipo", "robust"])
def test_each_loss_type_matches_trl_formula(name):
    np.testing.assert_allclose(ours([name]), trl(name), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("kind", F_KINDS)
@pytest.mark.parametrize("name", sorted(set(DPOConfig.f_divergence_losses) - {"sft"}))
def test_f_divergences_match_trl(name, kind):
    np.testing.assert_allclose(ours([name], f_divergence_type=kind), trl(name, kind), rtol=2e-5, atol=1e-6)


def test_alpha_divergence_at_one_is_reverse_kl_and_f_needs_a_delta_loss():
    np.testing.assert_allclose(ours(["sigmoid"], f_divergence_type="alpha_divergence", f_alpha_divergence_coef=1.0),
                               trl("sigmoid"), rtol=1e-6)
    with pytest.raises(ValueError, match="bco_pair"):
        ours(["bco_pair"], f_divergence_type="forward_kl")


def test_golden_values_at_policy_equal_to_reference():
    """c = r = 0: nca_pair 2 ln 2, bco_pair 2 ln 2, sppo_hard 2 (1/(2β))², apo_zero 1, apo_down 1,
    discopop ln 2 (σ(0) = ½ mix of ln 2 and e⁰ = 1 → (ln 2 + 1)/2)."""
    zeros, ones = jnp.zeros(2), jnp.ones(2)
    x = Pairs(zeros, zeros, zeros, zeros, ones, ones)
    p = LossParams(beta=0.5)
    want = {"nca_pair": 2 * math.log(2), "bco_pair": 2 * math.log(2), "sppo_hard": 2.0, "apo_zero": 1.0,
            "apo_down": 1.0, "discopop": (math.log(2) + 1) / 2, "sigmoid_norm": math.log(2)}
    for name, value in want.items():
        np.testing.assert_allclose(np.asarray(pair_losses(x, p, [name])), value, rtol=1e-6, err_msg=name)


def test_discopop_stays_finite_where_the_literal_formula_gives_inf_times_zero():
    x = Pairs(*(jnp.asarray([v], jnp.float32) for v in (-1000.0, 0.0, 0.0, 0.0, 1.0, 1.0)))  # βΔ = -100
    got = float(pair_losses(x, LossParams(beta=0.1), ["discopop"])[0])
    assert got == pytest.approx(-ls(-100.0), rel=1e-6)  # m = σ(-2000) = 0: the logistic part alone


def test_aot_sorts_within_the_batch():
    """aot / aot_unpaired compare the sorted margins: the mean does not depend on how pairs are ordered,
    and differs from sigmoid when the orders of policy and reference margins differ."""
    perm = np.array([3, 0, 4, 1, 2])
    for name in ("aot", "aot_unpaired"):
        x = Pairs(*(jnp.asarray(a[perm], jnp.float32) for a in (PC, PR, RC, RR, NC, NR)))
        permuted = np.asarray(pair_losses(x, LossParams(BETA, EPS), [name]))
        assert permuted.mean() == pytest.approx(ours([name]).mean(), rel=1e-6)
    assert ours(["aot"]).mean() != pytest.approx(ours(["sigmoid"]).mean(), rel=1e-3)


def test_weighted_combination_is_the_weighted_sum():
    """TRL 1.x: loss = Σ_i loss_weights[i] × loss_i (weights 1 each by default)."""
    mix = ours(["sigmoid", "bco_pair"], [0.8, 0.2])
    np.testing.assert_allclose(mix, 0.8 * trl("sigmoid") + 0.2 * trl("bco_pair"), rtol=2e-5)
    np.testing.assert_allclose(ours(["sigmoid", "bco_pair", "aot"]),
                               trl("sigmoid") + trl("bco_pair") + trl("aot"), rtol=2e-5)
    jitted = jax.jit(lambda x: pair_losses(x, LossParams(BETA), ("sigmoid", "bco_pair"), (0.8, 0.2)))
    x = Pairs(*(jnp.asarray(a, jnp.float32) for a in (PC, PR, RC, RR, NC, NR)))
    np.testing.assert_allclose(np.asarray(jitted(x)), mix, rtol=1e-6)
    with pytest.raises(ValueError, match="2 loss weights for 1"):
        ours(["sigmoid"], [0.5, 0.5])


def test_the_existing_four_are_unchanged():
    """Through the dispatcher the four old types give exactly what `dpo_loss` gave (default settings)."""
    x = Pairs(*(jnp.asarray(a, jnp.float32) for a in (PC, PR, RC, RR, np.ones(5), np.ones(5))))
    for name in ("sigmoid", "hinge", "ipo", "robust"):
        old = dpo_loss(x.chosen, x.rejected, x.ref_chosen, x.ref_rejected, BETA, name, EPS if name == "robust" else 0)
        new = pair_losses(x, LossParams(BETA, EPS if name == "robust" else 0.0), [name])
        np.testing.assert_array_equal(np.asarray(new), np.asarray(old))


def test_trl_compat_sigmoid_ignores_label_smoothing():
    """Default: cDPO −(1−ε) log σ(βΔ) − ε log σ(−βΔ); trl_compat: TRL 1.16's −log σ(βΔ)."""
    d = (PC - PR) - (RC - RR)
    np.testing.assert_allclose(ours(["sigmoid"], trl_compat=False),
                               -(1 - EPS) * ls(BETA * d) - EPS * ls(-BETA * d), rtol=2e-5)
    np.testing.assert_allclose(ours(["sigmoid"], trl_compat=True), -ls(BETA * d), rtol=2e-5)


@pytest.mark.parametrize("compat", [False, True])
def test_trl_compat_ipo_rewards(compat):
    """ipo's loss is the same; its rewards/* are length-normalised by default, summed (TRL 1.16) with trl_compat."""
    batch, policy = pair_batch(seed=3)
    _, ref = pair_batch(seed=4)
    loss, m = run_loss(dict(beta=0.5, loss_type="ipo", trl_compat=compat), batch, policy, ref)
    base, _ = run_loss(dict(beta=0.5, loss_type="ipo"), batch, policy, ref)
    assert float(loss) == float(base)
    n = np.array([3, 2, 3, 5]) if not compat else 1.0
    p, r = hand_logps(policy, batch) / n, hand_logps(ref, batch) / n
    chosen, rejected = 0.5 * (p[0::2] - r[0::2]), 0.5 * (p[1::2] - r[1::2])
    assert float(m["rewards/chosen"]) == pytest.approx(chosen.mean(), rel=1e-5)
    assert float(m["rewards/margins"]) == pytest.approx((chosen - rejected).mean(), rel=1e-5)


def test_sft_entry_equals_sft_weight_and_mixes_through_dpo_loss():
    batch, policy = pair_batch(seed=5)
    _, ref = pair_batch(seed=6)
    a, _ = run_loss(dict(sft_weight=0.5), batch, policy, ref)
    b, _ = run_loss(dict(loss_type=["sigmoid", "sft"], loss_weights=[1.0, 0.5]), batch, policy, ref)
    assert float(b) == pytest.approx(float(a), rel=1e-6)
    mix, _ = run_loss(dict(loss_type=["sigmoid", "bco_pair"], loss_weights=[0.8, 0.2]), batch, policy, ref)
    p, r = hand_logps(policy, batch), hand_logps(ref, batch)
    c, rj = p[0::2] - r[0::2], p[1::2] - r[1::2]
    want = np.mean(0.8 * -ls(0.1 * (c - rj)) + 0.2 * (-ls(0.1 * c) - ls(-0.1 * rj)))
    assert float(mix) == pytest.approx(want, rel=1e-5)


def check(**kw) -> str:
    """DPOConfig.check's one-paragraph error for `kw` over the defaults."""
    with pytest.raises(ConfigError) as info:
        DPOConfig.check(OmegaConf.merge(OmegaConf.structured(DPOConfig), kw), None)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("kw, words", [
    (dict(loss_type=["sigmoid", "bco_pairs"]), ["'algorithm.loss_type.1'", "'bco_pairs'", "Did you mean bco_pair"]),
    (dict(loss_type="nca"), ["'algorithm.loss_type'", "'nca'", "nca_pair"]),
    (dict(loss_type=[]), ["'algorithm.loss_type'", "non-empty list", "sigmoid"]),
    (dict(loss_type=["sigmoid", "bco_pair"], loss_weights=[0.8]), ["'algorithm.loss_weights'", "[0.8]", "1 weight for",
                                                                  "2 loss types", "one weight per loss type"]),
    (dict(loss_weights=0.5), ["'algorithm.loss_weights'=0.5", "list of numbers"]),
    (dict(loss_type=["sigmoid", "ipo"], loss_weights=[1, -2]), ["'algorithm.loss_weights.1'=-2", ">= 0", "'ipo'"]),
    (dict(loss_type="exo_pair"), ["'algorithm.label_smoothing'=0.0", "exo_pair", "1e-3"]),
    (dict(loss_type="hinge", label_smoothing=0.1), ["'algorithm.label_smoothing'=0.1", "robust", "['hinge']"]),
    (dict(label_smoothing=0.1, trl_compat=True), ["'algorithm.label_smoothing'=0.1", "trl_compat", "['sigmoid']"]),
    (dict(label_smoothing=0.5), ["'algorithm.label_smoothing'=0.5", "[0, 0.5)"]),
    (dict(f_divergence_type="kl"), ["'algorithm.f_divergence_type'", "'kl'", "js_divergence"]),
    (dict(loss_type=["sigmoid", "bco_pair"], f_divergence_type="forward_kl"),
     ["'algorithm.f_divergence_type'='forward_kl'", "['bco_pair']", "reverse_kl"]),
    (dict(discopop_tau=0.0), ["'algorithm.discopop_tau'=0.0", "> 0"]),
])
def test_config_errors_name_key_value_and_allowed(kw, words):
    msg = check(**kw)
    for word in words:
        assert word in msg, (word, msg)


def test_valid_configs_pass():
    for kw in (dict(loss_type=["sigmoid", "bco_pair"], loss_weights=[0.8, 0.2]), dict(loss_type="exo_pair",
               label_smoothing=1e-3), dict(loss_type=["aot", "sft"], label_smoothing=0.1),
               dict(loss_type="ipo", f_divergence_type="js_divergence"), dict(label_smoothing=0.1)):
        DPOConfig.check(OmegaConf.merge(OmegaConf.structured(DPOConfig), kw), None)


def test_the_command_line_takes_a_list_of_loss_types():
    from stack.cli.app import preflight

    base = ["algorithm=dpo", "data=jsonl_prefs", "algorithm.loss_type=[sigmoid,bco_pair]"]
    cfg = preflight([*base, "algorithm.loss_weights=[0.8,0.2]"])
    assert list(cfg.algorithm.loss_type) == ["sigmoid", "bco_pair"] and list(cfg.algorithm.loss_weights) == [0.8, 0.2]
    with pytest.raises(ConfigError, match=r"'algorithm.loss_weights'=\[0.8\] has 1 weight for the 2 loss types"):
        preflight([*base, "algorithm.loss_weights=[0.8]"])
