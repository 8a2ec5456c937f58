"""PPO against independent computations: TRL PPOTrainer's reward shaping, GAE and whitening as a
NumPy loop, its clipped losses by hand, the adaptive KL controller's formula, and the alignment
rules (the value of the state before a token, the score on the last real token, nothing after EOS)."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stack.algorithms.base import Context, ratio
from stack.algorithms.ppo import PPO, rewards_per_token
from stack.config.schema.model import ModelConfig
from stack.data.tokenizers import ByteTokenizer
from stack.engine.step import Models
from stack.models.heads import Critic, ScalarHead
from stack.models.init import init_model
from stack.quant.providers import NoQuantization

RULES = SimpleNamespace(weights=[1.0], names=["rule"])


def test_kl_on_real_tokens_and_the_score_on_the_last_one():
    kl = jnp.asarray([[0.1, 0.2, 0.3, 0.4]])
    rewards, non_score = rewards_per_token(kl, jnp.asarray([2.0]), jnp.asarray([[1.0, 1.0, 1.0, 0.0]]), 0.5)
    np.testing.assert_allclose(non_score, [[-0.05, -0.1, -0.15, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(rewards, [[-0.05, -0.1, 1.85, 0.0]], rtol=1e-6)


def numpy_reference(score, old, ref, values, mask, coef, gamma, lam):
    """TRL PPOTrainer's steps 4-6 in float64 loops: k1 KL reward, score on the last real token,
    GAE with bootstrap 0, returns before whitening, whitening with the unbiased variance."""
    b, n = mask.shape
    rewards = -coef * (old - ref) * mask
    for i in range(b):
        rewards[i, int(mask[i].sum()) - 1] += score[i]
    values = values * mask
    adv = np.zeros((b, n))
    for i in range(b):
        last = 0.0
        for t in reversed(range(n)):
            nxt = values[i, t + 1] if t + 1 < n else 0.0
            last = rewards[i, t] + gamma * nxt - values[i, t] + gamma * lam * last
            adv[i, t] = last * mask[i, t]
    returns = adv + values
    real = adv[mask > 0]
    whitened = (adv - real.mean()) / np.sqrt(real.var(ddof=1) + 1e-8) * mask
    return whitened, returns


def round_xp(rng, truncated=(0, 1, 0)):
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], np.float32)
    return {"completion": np.ones((1, 3, 5), np.int32), "completion_mask": mask[None],
            "truncated": np.array([truncated], np.float32),
            "old_logps": rng.normal(-1, 0.5, (1, 3, 5)).astype(np.float32),
            "ref_logps": rng.normal(-1, 0.5, (1, 3, 5)).astype(np.float32),
            "old_values": rng.normal(0, 1, (1, 3, 5)).astype(np.float32)}


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8)])
def test_finalize_matches_trl_steps_in_numpy(gamma, lam):
    rng = np.random.default_rng(0)
    xp = round_xp(rng)
    ppo = PPO(kl_coef=0.1, gamma=gamma, lam=lam)
    ppo.rewards = RULES
    scores = jnp.asarray([[[1.0], [np.nan], [0.5]]])  # the 2nd completion: no function answered -> 0
    out, state, metrics = ppo.finalize({k: jnp.asarray(v) for k, v in xp.items()}, scores, {"kl_coef": 0.1})
    want_adv, want_ret = numpy_reference(np.array([1.0, 0.0, 0.5]), xp["old_logps"][0].astype(np.float64),
                                         xp["ref_logps"][0], xp["old_values"][0], xp["completion_mask"][0],
                                         0.1, gamma, lam)
    np.testing.assert_allclose(np.asarray(out["returns"][0]), want_ret, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out["advantages"][0]), want_adv, rtol=1e-4, atol=1e-5)
    assert float(state["kl_coef"]) == 0.1  # fixed
    kl = ((xp["old_logps"] - xp["ref_logps"]) * xp["completion_mask"]).sum(-1).mean()
    assert float(metrics["objective/kl"]) == pytest.approx(kl, rel=1e-5)
    assert float(metrics["objective/non_score_reward"]) == pytest.approx(-0.1 * kl, rel=1e-5)
    assert float(metrics["objective/scores"]) == pytest.approx(0.5, rel=1e-6)


def test_missing_eos_penalty_and_the_adaptive_controller():
    rng = np.random.default_rng(1)
    xp = {k: jnp.asarray(v) for k, v in round_xp(rng).items()}
    ppo = PPO(kl_coef=0.2, adaptive_kl=True, target_kl=0.5, horizon=100.0, missing_eos_penalty=1.0)
    ppo.rewards = RULES
    _, state, metrics = ppo.finalize(xp, jnp.ones((1, 3, 1)), {"kl_coef": jnp.float32(0.2)})
    assert float(metrics["objective/scores"]) == pytest.approx((1 + 0 + 1) / 3)  # the truncated one: 1 - 1
    kl = float(metrics["objective/kl"])
    err = np.clip(kl / 0.5 - 1, -0.2, 0.2)  # Ziegler et al. 2019: n = 3 rollouts, horizon 100
    assert float(state["kl_coef"]) == pytest.approx(0.2 * (1 + err * 3 / 100), rel=1e-6)
    assert float(metrics["kl_coef"]) == pytest.approx(0.2)  # this round's rewards used the old value


class Fixed:
    """A stand-in policy: fixed (log-probs, entropies, features) whatever the input."""

    def __init__(self, logps, features):
        self.out = (jnp.asarray(logps), jnp.zeros_like(jnp.asarray(logps)), jnp.asarray(features)[..., None])

    def __call__(self, tokens, positions, segments, targets, temperature, features):
        return self.out


def test_loss_at_ratio_one_and_the_clipped_value_loss_by_hand():
    logps = np.array([[-1.0, -2.0, -0.5]], np.float32)
    head = ScalarHead(1)
    head.kernel[...] = jnp.ones((1, 1))  # value = the feature
    vpred = np.array([[1.5, 0.1, 9.0]], np.float32)
    batch = {"prompt_ids": np.ones((1, 2), np.int32), "prompt_mask": np.ones((1, 2), np.int32),
             "completion": np.ones((1, 3), np.int32), "completion_mask": np.array([[1, 1, 0]], np.int32),
             "old_logps": logps, "advantages": np.array([[0.5, -1.0, 7.0]], np.float32),
             "old_values": np.array([[1.0, 0.0, 0.0]], np.float32), "returns": np.array([[2.0, 0.0, 0.0]], np.float32)}
    ppo = PPO(vf_coef=0.1, cliprange_value=0.2)
    models = SimpleNamespace(policy=Fixed(logps, vpred), value=Critic(head))
    terms, metrics = ppo.loss(models, batch, None, {}, jax.random.key(0))
    assert float(metrics["policy/clipfrac_avg"]) == 0.0 and float(metrics["policy/approxkl_avg"]) == 0.0
    assert float(metrics["val/ratio"]) == 1.0
    assert float(metrics["loss/policy_avg"]) == pytest.approx(-(0.5 - 1.0) / 2)  # -A at ratio 1, real tokens
    # token 0: v 1.5, old 1.0, R 2.0 -> clipped v 1.2: max(0.25, 0.64) / 2 = 0.32 (clipped);
    # token 1: v 0.1, old 0.0, R 0.0 -> within the clip: 0.01 / 2 = 0.005; token 2 is after EOS
    assert float(metrics["loss/value_avg"]) == pytest.approx((0.32 + 0.005) / 2, rel=1e-5)
    assert float(metrics["val/clipfrac_avg"]) == 0.5
    assert float(ratio(terms)) == pytest.approx(0.25 + 0.1 * (0.32 + 0.005) / 2, rel=1e-5)


CFG = ModelConfig(vocab_size=259, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=64)


@pytest.fixture(scope="module")
def setup_run():
    """A tiny real policy with PPO's modules; prompts of different lengths (left-padded)."""
    policy = init_model(CFG, 0)
    ppo = PPO(max_new_tokens=5, temperature=1.0)
    setup = ppo.setup(policy, Context(NoQuantization(), ByteTokenizer(), RULES, seed=0))
    ids = np.array([[0, 0, 1, 40, 50, 60], [1, 70, 71, 72, 73, 74]], np.int32)
    batch = {"prompt_ids": ids[None], "prompt_mask": (ids > 0).astype(np.int32)[None], "index": np.array([[0, 1]])}
    models, frozen = Models(policy=policy, **setup.trained), Models(**setup.frozen)
    collect = nnx.jit(lambda m, f, b: ppo.collect(m, f, (), b, jax.random.key(3), True))
    return ppo, models, frozen, collect(models, frozen, {k: jnp.asarray(v) for k, v in batch.items()})


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_policy_equal_to_reference_gives_kl_zero(setup_run, estimator):
    ppo, _, _, xp = setup_run
    ppo.kl_estimator, ppo.rewards = estimator, RULES
    _, _, metrics = ppo.finalize(xp, jnp.zeros((1, 2, 1)), {"kl_coef": jnp.float32(0.05)})
    assert float(metrics["objective/kl"]) == 0.0 and float(metrics["objective/non_score_reward"]) == 0.0


def test_the_value_of_a_token_is_that_of_the_state_before_it(setup_run):
    ppo, models, _, xp = setup_run
    x = jax.tree.map(lambda v: v[0], xp)
    seq = jnp.concatenate([x["prompt_ids"], x["completion"]], -1)
    segments = jnp.concatenate([x["prompt_mask"], jnp.ones_like(x["completion"])], -1)
    positions = jnp.maximum(jnp.cumsum(segments, -1) - 1, 0)
    features = models.value.trunk(seq, positions, segments, features=True)  # every position of the sequence
    every = models.value.head(features)
    p = x["prompt_ids"].shape[1]
    np.testing.assert_allclose(np.asarray(x["old_values"]), np.asarray(every[:, p - 1:-1]), atol=1e-5)


def test_tokens_after_eos_change_nothing(setup_run):
    ppo, models, frozen, xp = setup_run
    ppo.rewards = RULES
    x = jax.tree.map(lambda v: v[0], xp)
    mask = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], np.int32)  # row 0 ends (EOS) at its 2nd token
    x = {**x, "completion_mask": jnp.asarray(mask), "completion": x["completion"].at[0, 1].set(2)}
    out, _, _ = ppo.finalize(jax.tree.map(lambda v: v[None], x), jnp.ones((1, 2, 1)), {"kl_coef": jnp.float32(0.05)})
    batch = jax.tree.map(lambda v: v[0], out)
    other = {**batch, "completion": batch["completion"].at[0, 2:].set(99),
             "old_logps": batch["old_logps"].at[0, 2:].set(-50.0), "old_values": batch["old_values"].at[0, 2:].set(7.0)}
    assert float(batch["advantages"][0, 2:].sum()) == 0.0
    losses = [ratio(ppo.loss(models, b, frozen, {}, jax.random.key(0))[0]) for b in (batch, other)]
    assert float(losses[0]) == pytest.approx(float(losses[1]), rel=1e-6)


@pytest.mark.parametrize("overrides,match", [
    (["reward=model"], r"'reward.init_from' is required: reward=model scores with a reward model"),
    (["reward=model", "reward.init_from=/x", "reward.functions=[accuracy]", "reward.weights=[1.0]"],
     r"^'reward.weights' has 1 entries for 2 scorers \(\['accuracy', \"the reward model '/x'\"\]\); give one weight "
     r"per function, the reward model's last, or null"),
    (["reward=rules", "reward.functions=[]"], r"'reward.functions' is empty: .* or score with a reward model"),
    (["algorithm.kl_estimator=k2"], r"algorithm.kl_estimator.*k1.*k3"),
    (["algorithm.shared_trunk=false", "quantization=lora"], r"shared_trunk'=false with quantization=lora"),
    (["trainer.steps=10"], r"multiple of num_ppo_epochs x num_mini_batches = 4"),
    (["algorithm.lam=1.5"], r"'algorithm.lam'=1.5 must be in \[0, 1\]"),
])
def test_bad_ppo_configs_are_one_clear_error(overrides, match):
    from stack.config.validate import validate
    from stack.errors import ConfigError
    from tests.helpers import make_cfg

    with pytest.raises(ConfigError, match=match):
        validate(make_cfg(["algorithm=ppo", "data=jsonl_prompts", *overrides]))


def test_a_reward_model_dir_must_hold_a_reward_model(tmp_path):
    from stack.errors import ConfigError
    from stack.rewards.model import ModelReward, score_texts

    with pytest.raises(ConfigError, match="no run config.yaml beside it"):
        ModelReward(str(tmp_path / "checkpoints")).load()
    (tmp_path / "config.yaml").write_text("algorithm:\n  name: sft\n")
    with pytest.raises(ConfigError, match="written by algorithm='sft', not a reward model"):
        ModelReward(str(tmp_path / "checkpoints")).load()
    with pytest.raises(ConfigError, match=r"^--score's reward model \(an algorithm=rm run's checkpoints or a HF "
                                          r"dir\)='.*' was written by algorithm='sft'"):  # no reward.init_from key
        score_texts(str(tmp_path / "checkpoints"), ["1+2="], ["3"])


def test_the_recipe_takes_a_reward_model_in_place_of_its_rules():
    """The issue's command: the recipe's rules (reward=arithmetic) give way to reward=model."""
    from stack.config.validate import validate
    from tests.helpers import make_cfg

    cfg = make_cfg(["+recipe=llama_ppo", "reward=model", "reward.init_from=/runs/rm/checkpoints"])
    validate(cfg)
    assert cfg.reward.functions == [] and cfg.reward.init_from == "/runs/rm/checkpoints"
