"""PPO's math (stack.algorithms.rlmath) against closed forms, hand computations and plain NumPy
references written from TRL PPOTrainer's formulas and Ziegler et al. 2019, not from the code."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stack.algorithms.rlmath import (
    adaptive_kl_coef,
    clipped_value_loss,
    gae,
    kl_estimate,
    masked_var,
    masked_whiten,
)


def _gae_reference(rewards: np.ndarray, values: np.ndarray, mask: np.ndarray, gamma: float,
                   lam: float) -> tuple[np.ndarray, np.ndarray]:
    """TRL PPOTrainer's reversed loop, in float64, one row and one token at a time."""
    rewards, values = rewards.astype(np.float64) * mask, values.astype(np.float64) * mask
    adv = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        last = 0.0
        for t in reversed(range(rewards.shape[1])):
            next_value = values[b, t + 1] if t + 1 < rewards.shape[1] else 0.0
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            last = delta + gamma * lam * last
            adv[b, t] = last
    adv = adv * mask
    return adv, adv + values


def _ragged_batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = [7, 1, 4, 5]  # one row fully in, one ending at the first token
    mask = (np.arange(7)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)
    return rng.normal(size=(4, 7)).astype(np.float32), rng.normal(size=(4, 7)).astype(np.float32), mask


def test_gae_of_a_terminal_reward_with_zero_values_is_the_discounted_reward():
    rewards = jnp.asarray([[0.0, 0.0, 0.0, 1.0]])
    adv, ret = gae(rewards, jnp.zeros((1, 4)), jnp.ones((1, 4)), 0.9, 0.95)
    expected = [(0.9 * 0.95) ** (3 - t) for t in range(4)]  # δ_t = r_t, so A_t = (γλ)^(3−t)
    np.testing.assert_allclose(np.asarray(adv)[0], expected, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ret), np.asarray(adv), rtol=1e-6)


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (0.99, 1.0)])
def test_gae_of_ragged_rows_matches_a_numpy_loop(gamma, lam):
    rewards, values, mask = _ragged_batch()
    adv, ret = gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), gamma, lam)
    ref_adv, ref_ret = _gae_reference(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(np.asarray(adv), ref_adv, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ret), ref_ret, atol=1e-5, rtol=1e-5)
    assert (np.asarray(adv)[mask == 0] == 0).all() and (np.asarray(ret)[mask == 0] == 0).all()


def test_gae_ignores_rewards_and_values_after_the_end():
    rewards, values, mask = _ragged_batch(1)
    before = gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), 0.95, 0.9)
    rewards[1, 1:] += 5.0  # the row that ends at the first token
    values[2, 4] -= 3.0  # just past the end of a length-4 row: would be its V_{t+1}
    after = jax.jit(gae, static_argnums=(3, 4))(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask),
                                                0.95, 0.9)
    for x, y in zip(before, after, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)


def test_gae_gives_no_advantage_where_the_mask_has_a_hole():
    # mask [1, 0, 1, 1], r = [0, 5, 0, 1], V = 0: the hole counts as r = 0, V = 0 and gets A = 0;
    # A_3 = 1, A_2 = γλ = 0.5, A_1 (hole) = 0, A_0 = (γλ)^3 = 0.125 with γ = 1, λ = 0.5
    adv, ret = gae(jnp.asarray([[0.0, 5.0, 0.0, 1.0]]), jnp.zeros((1, 4)), jnp.asarray([[1.0, 0.0, 1.0, 1.0]]),
                   1.0, 0.5)
    np.testing.assert_allclose(np.asarray(adv)[0], [0.125, 0.0, 0.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ret), np.asarray(adv), rtol=1e-6)


def _masked_x() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    x = rng.normal(loc=3.0, scale=2.0, size=(3, 5)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], np.float32)
    x[mask == 0] = 100.0  # masked-out entries would swamp the statistics if counted
    return x, mask


@pytest.mark.parametrize("shift_mean", [True, False])
def test_masked_whiten_matches_numpy(shift_mean):
    x, mask = _masked_x()
    kept = x[mask == 1].astype(np.float64)
    mean, var = kept.mean(), kept.var(ddof=1)
    expected = (x - mean) / np.sqrt(var + 1e-8) + (0.0 if shift_mean else mean)
    out = masked_whiten(jnp.asarray(x), jnp.asarray(mask), shift_mean=shift_mean)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5)
    if shift_mean:
        assert np.asarray(out)[mask == 1].mean() == pytest.approx(0.0, abs=1e-5)


@pytest.mark.parametrize("unbiased,ddof", [(True, 1), (False, 0)])
def test_masked_var_matches_numpy(unbiased, ddof):
    x, mask = _masked_x()
    out = masked_var(jnp.asarray(x), jnp.asarray(mask), unbiased=unbiased)
    assert float(out) == pytest.approx(x[mask == 1].astype(np.float64).var(ddof=ddof), rel=1e-5)


def test_masked_var_of_one_or_no_entries_is_zero_not_an_error():
    x = jnp.asarray([[2.0, 7.0, -1.0]])
    for mask in ([[1.0, 0.0, 0.0]], [[0.0, 0.0, 0.0]]):
        out = jax.jit(masked_var)(x, jnp.asarray(mask))
        assert float(out) == 0.0


def test_clipped_value_loss_by_hand():
    # clip 0.2 around old = 1.0, so v is clipped into [0.8, 1.2]:
    # v=1.5, R=2.0: clipped 1.2; (1.5−2)² = 0.25 < (1.2−2)² = 0.64 → ½·0.64 = 0.32, clipped term larger: 1
    # v=1.5, R=0.0: clipped 1.2; (1.5−0)² = 2.25 > (1.2−0)² = 1.44 → ½·2.25 = 1.125, indicator 0
    # v=0.5, R=0.0: clipped 0.8; (0.5−0)² = 0.25 < (0.8−0)² = 0.64 → 0.32, indicator 1
    # v=0.5, R=2.0: clipped 0.8; (0.5−2)² = 2.25 > (0.8−2)² = 1.44 → 1.125, indicator 0
    # v=1.1, R=2.0: inside the range, both (1.1−2)² = 0.81 → 0.405, indicator 0 (not strictly larger)
    values = jnp.asarray([1.5, 1.5, 0.5, 0.5, 1.1])
    returns = jnp.asarray([2.0, 0.0, 0.0, 2.0, 2.0])
    loss, clipped = clipped_value_loss(values, jnp.ones(5), returns, 0.2)
    np.testing.assert_allclose(np.asarray(loss), [0.32, 1.125, 0.32, 1.125, 0.405], rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(clipped), [1.0, 0.0, 1.0, 0.0, 0.0])
    assert clipped.dtype == jnp.float32


def test_clipping_is_relative_to_the_rollout_values():
    # v=1.5, R=2.0, clip 0.2 but old = 1.4: clipped into [1.2, 1.6] leaves 1.5 alone → ½·0.25 = 0.125
    loss, clipped = clipped_value_loss(jnp.asarray([1.5]), jnp.asarray([1.4]), jnp.asarray([2.0]), 0.2)
    assert float(loss[0]) == pytest.approx(0.125, rel=1e-6) and float(clipped[0]) == 0.0


@pytest.mark.parametrize("kl,expected", [
    (12.0, 0.1 * (1 + 0.2 * 256 / 10000)),  # 12/6 − 1 = 1, clipped to 0.2 → 0.100512
    (3.0, 0.1 * (1 - 0.2 * 256 / 10000)),  # 3/6 − 1 = −0.5, clipped to −0.2 → 0.099488
    (6.6, 0.1 * (1 + 0.1 * 256 / 10000)),  # 6.6/6 − 1 = 0.1, inside the clip → 0.100256
    (6.0, 0.1),  # at the target the coefficient stays
])
def test_adaptive_kl_coef_follows_ziegler_et_al(kl, expected):
    assert float(adaptive_kl_coef(0.1, kl, 6.0, 10000, 256)) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_kl_estimate_is_zero_at_the_reference(estimator):
    logp = jnp.asarray([-0.3, -2.0, -7.5])
    np.testing.assert_array_equal(np.asarray(kl_estimate(logp, logp, estimator)), np.zeros(3))
