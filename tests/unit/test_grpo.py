"""GRPO's math against hand computations from TRL GRPOTrainer's formulas (expected numbers are
written from the formulas, not from the code), and the rule rewards."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stack.algorithms.grpo import GRPO
from stack.algorithms.rlmath import group_advantages, kl_estimate
from stack.rewards.functions import accuracy, digits, format_match, length_penalty
from stack.rewards.model import ModelReward
from tests.helpers import loss_of

REWARDS = np.array([[1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5]], np.float32)  # 2 prompts x G=4


@pytest.mark.parametrize("scale,row0", [
    ("group", 0.5 / (math.sqrt(1 / 3) + 1e-4)),  # group mean 0.5, unbiased std sqrt(4 * 0.25 / 3)
    ("batch", 0.5 / (math.sqrt(1 / 7) + 1e-4)),  # batch mean 0.5, unbiased std sqrt(4 * 0.25 / 7)
    ("none", 0.5),
])
def test_group_advantages_of_a_2x4_reward_matrix(scale, row0):
    adv, std = group_advantages(jnp.asarray(REWARDS), 4, scale)
    np.testing.assert_allclose(np.asarray(adv)[0], [row0, -row0, -row0, row0, 0, 0, 0, 0], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(std)[0], [math.sqrt(1 / 3), 0.0], rtol=1e-6)  # the 2nd group: zero std


def test_a_nan_reward_is_left_out_of_its_group_and_gets_no_advantage():
    adv, std = group_advantages(jnp.asarray([[1.0, np.nan, 0.0, 1.0]]), 4, "group")
    mean, sd = 2 / 3, math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2)  # over the 3 valid rewards
    np.testing.assert_allclose(np.asarray(adv)[0], [(1 - mean) / (sd + 1e-4), 0.0, -mean / (sd + 1e-4),
                                                    (1 - mean) / (sd + 1e-4)], rtol=1e-5)
    assert not np.isnan(np.asarray(adv)).any() and float(std[0, 0]) == pytest.approx(sd, rel=1e-6)


def test_kl_estimators_at_and_away_from_the_reference():
    logp, ref = jnp.asarray([-1.0, -2.0]), jnp.asarray([-1.5, -2.0])
    for estimator in ("k1", "k2", "k3"):
        assert float(jnp.abs(kl_estimate(logp, logp, estimator)).max()) == 0.0  # policy = reference
    d = -0.5  # log pi_ref - log pi at the first token
    np.testing.assert_allclose(np.asarray(kl_estimate(logp, ref, "k1")), [-d, 0.0])
    np.testing.assert_allclose(np.asarray(kl_estimate(logp, ref, "k2")), [0.5 * d**2, 0.0])
    np.testing.assert_allclose(np.asarray(kl_estimate(logp, ref, "k3")), [math.exp(d) - d - 1, 0.0], rtol=1e-6)


class Scores:
    """A stand-in policy whose training forward returns fixed (log-probs, entropies)."""

    def __init__(self, logps, entropy=None):
        self.out = (jnp.asarray(logps), jnp.zeros_like(jnp.asarray(logps)) if entropy is None else jnp.asarray(entropy))

    def __call__(self, tokens, positions, segment_ids, targets, temperature):
        return self.out


LOGP = [[-1.0, -0.5, -2.0], [-0.2, -0.3, -0.4]]
BATCH = {"prompt_ids": np.ones((2, 2), np.int32), "prompt_mask": np.ones((2, 2), np.int32),
         "completion": np.ones((2, 3), np.int32), "completion_mask": np.array([[1, 1, 0], [1, 1, 1]], np.int32),
         "old_logps": np.array([[-1.0, -0.7, -2.0], [-0.5, -0.3, -0.1]], np.float32),
         "advantages": np.array([1.0, -2.0], np.float32)}
# per-token -min(r A, clip(r, 0.8, 1.2) A), r = exp(logp - old):
#   sequence 0 (A = 1):  r = 1 -> -1;  r = e^0.2 = 1.2214 -> clipped to 1.2 -> -1.2;  (masked)
#   sequence 1 (A = -2): r = e^0.3 = 1.3499 -> -(-2.69972) = 2.69972;  r = 1 -> 2;  r = e^-0.3 = 0.7408 -> 0.8 x 2 = 1.6
SEQ = [[-1.0, -1.2], [2 * math.exp(0.3), 2.0, 1.6]]


@pytest.mark.parametrize("loss_type,expected", [
    ("dapo", (sum(SEQ[0]) + sum(SEQ[1])) / 5),  # all tokens of the batch
    ("bnpo", (sum(SEQ[0]) + sum(SEQ[1])) / 5),  # tokens of the micro-batch (one here)
    ("grpo", (sum(SEQ[0]) / 2 + sum(SEQ[1]) / 3) / 2),  # per-sequence mean, then the mean
    ("dr_grpo", (sum(SEQ[0]) + sum(SEQ[1])) / (2 * 3)),  # sequences x max_new_tokens
])
def test_loss_types_by_hand(loss_type, expected):
    grpo = GRPO(loss_type=loss_type, epsilon=0.2, max_new_tokens=3)
    loss, m = loss_of(grpo, Scores(LOGP), BATCH)
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(m["clip_ratio/low_mean"]) == pytest.approx(1 / 5)  # r < 0.8 with A < 0: seq 1, token 2
    assert float(m["clip_ratio/high_mean"]) == pytest.approx(1 / 5)  # r > 1.2 with A > 0: seq 0, token 1
    assert float(m["clip_ratio/region_mean"]) == pytest.approx(2 / 5)


def test_clip_higher_and_the_kl_term():
    loss, _ = loss_of(GRPO(epsilon=0.2, epsilon_high=0.28, max_new_tokens=3), Scores(LOGP), BATCH)
    dapo_high = (-1.0 - math.exp(0.2) + sum(SEQ[1])) / 5  # e^0.2 = 1.2214 < 1.28: not clipped
    assert float(loss) == pytest.approx(dapo_high, rel=1e-6)
    ref = np.array(LOGP, np.float32) - 0.1  # log pi_ref - log pi = -0.1 everywhere
    plain = GRPO(beta=0.5, max_new_tokens=3, use_bias_correction_kl=False)  # bias correction: its own test
    loss_kl, m = loss_of(plain, Scores(LOGP), {**BATCH, "ref_logps": ref})
    k3 = math.exp(-0.1) + 0.1 - 1
    assert float(m["kl"]) == pytest.approx(k3, rel=1e-5)
    assert float(loss_kl) == pytest.approx((sum(SEQ[0]) + sum(SEQ[1])) / 5 + 0.5 * k3, rel=1e-5)


@pytest.mark.parametrize("loss_type,expected", [("dapo", sum(SEQ[0]) / 2), ("grpo", sum(SEQ[0]) / 2 / 2),
                                                ("dr_grpo", sum(SEQ[0]) / (2 * 3))])
def test_mask_truncated_completions_leaves_the_truncated_ones_out_of_the_loss(loss_type, expected):
    """TRL GRPOConfig.mask_truncated_completions (DAPO): completion_mask * ~is_truncated before the
    loss; sequence 1 (all 3 tokens, no EOS) is truncated, sequence 0 ended."""
    batch = {**BATCH, "truncated": np.array([False, True])}
    grpo = GRPO(loss_type=loss_type, epsilon=0.2, max_new_tokens=3, mask_truncated_completions=True)
    loss, m = loss_of(grpo, Scores(LOGP), batch)
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(m["clip_ratio/high_mean"]) == pytest.approx(1 / 2)  # of sequence 0's 2 tokens
    assert float(loss_of(GRPO(loss_type=loss_type, max_new_tokens=3), Scores(LOGP), batch)[0]) != pytest.approx(
        expected)  # off (the default): the truncated sequence counts


@pytest.mark.parametrize("epsilon,loss_type,expected,high", [
    (0.2, "dapo", (-2 * math.exp(0.1) + 3 * 2) / 5, 0.0),  # mean log-ratios: seq 0 (0 + 0.2) / 2, seq 1 0
    (0.2, "grpo", (-math.exp(0.1) + 2) / 2, 0.0),
    (0.05, "dapo", (-2 * 1.05 + 3 * 2) / 5, 1 / 2),  # e^0.1 > 1.05 with A > 0: sequence 0 of 2 clipped
])
def test_sequence_level_importance_sampling_by_hand(epsilon, loss_type, expected, high):
    """TRL importance_sampling_level=sequence (GSPO): one ratio per completion, exp of the mean of
    its masked tokens' log π − log π_old, clipped and weighted as a token's ratio is; the clip
    metrics are over sequences (TRL 1.16's global_masked_mean of a [B, 1] ratio)."""
    grpo = GRPO(loss_type=loss_type, epsilon=epsilon, max_new_tokens=3, importance_sampling_level="sequence")
    loss, m = loss_of(grpo, Scores(LOGP), BATCH)
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(m["clip_ratio/high_mean"]) == pytest.approx(high) and float(m["clip_ratio/low_mean"]) == 0.0


def test_delta_caps_the_unclipped_ratio():
    """TRL GRPOConfig.delta (two-sided clipping): seq 1 token 0 has r = e^0.3 with A = -2, whose
    unclipped term -2 e^0.3 won the min; capped at 1.25 it becomes -2.5 (loss 2.5). Seq 0 token 1
    (r = e^0.2 < 1.25, A > 0) keeps its clip at 1.2."""
    loss, _ = loss_of(GRPO(epsilon=0.2, max_new_tokens=3, delta=1.25), Scores(LOGP), BATCH)
    assert float(loss) == pytest.approx((sum(SEQ[0]) + 2.5 + 2.0 + 1.6) / 5, rel=1e-6)


def test_top_entropy_quantile_keeps_the_loss_of_the_high_entropy_tokens():
    """TRL top_entropy_quantile=0.5: the threshold is the median (linear quantile) of the 5 real
    tokens' entropies 0.1, 0.5, 0.3, 0.2, 0.4 = 0.3; tokens >= 0.3 keep their surrogate, the
    normaliser stays every real token (dapo: 5); the padded token's 9.0 plays no part."""
    entropy = [[0.1, 0.5, 9.0], [0.3, 0.2, 0.4]]
    grpo = GRPO(epsilon=0.2, max_new_tokens=3, top_entropy_quantile=0.5)
    loss, m = loss_of(grpo, Scores(LOGP, entropy), BATCH)
    assert float(loss) == pytest.approx((SEQ[0][1] + SEQ[1][0] + SEQ[1][2]) / 5, rel=1e-6)
    assert float(m["entropy"]) == pytest.approx(1.5 / 5)  # the metric is of every real token
    full = float(loss_of(GRPO(epsilon=0.2, max_new_tokens=3, top_entropy_quantile=1.0), Scores(LOGP, entropy),
                         BATCH)[0])
    assert full == pytest.approx((sum(SEQ[0]) + sum(SEQ[1])) / 5, rel=1e-6)


def test_ratio_one_means_no_clipping_and_policy_equal_reference_means_no_kl():
    old = np.array(LOGP, np.float32)
    batch = {**BATCH, "old_logps": old, "ref_logps": old}
    _, m = loss_of(GRPO(beta=0.1, max_new_tokens=3), Scores(LOGP), batch)
    assert float(m["kl"]) == 0.0
    assert all(float(m[f"clip_ratio/{k}_mean"]) == 0.0 for k in ("low", "high", "region"))


class Rewards:
    names, weights = ["accuracy", "format"], np.array([1.0, 0.5], np.float32)


def test_finalize_weighs_rewards_skipping_nan_and_counts_zero_std_groups():
    grpo = GRPO(num_generations=2)
    grpo.rewards = Rewards()
    scores = jnp.asarray([[[1.0, 1.0], [0.0, np.nan], [1.0, 0.0], [1.0, 0.0]]])  # 2 prompts x G=2
    xp = {"completion_mask": jnp.ones((1, 4, 3), jnp.int32), "truncated": jnp.asarray([[True, False, False, False]]),
          "sampler_logps": jnp.zeros((1, 4, 3)), "old_logps": jnp.full((1, 4, 3), -1e-5)}
    out, _, m = grpo.finalize(xp, scores, ())
    # weighted sums with NaN skipped: 1.5, 0.0 (format NaN), 1.0, 1.0 -> groups (1.5, 0) and (1, 1)
    assert float(m["reward"]) == pytest.approx((1.5 + 0 + 1 + 1) / 4)
    assert float(m["frac_reward_zero_std"]) == 0.5 and float(m["reward/errors"]) == 1.0
    assert float(m["rewards/format/mean"]) == pytest.approx(1 / 3)  # NaN left out of the mean
    assert float(m["completions/clipped_ratio"]) == 0.25 and float(m["logprob_mismatch"]) == pytest.approx(1e-5)
    adv = np.asarray(out["advantages"])[0]
    assert adv[2] == adv[3] == 0.0 and adv[0] == pytest.approx(-adv[1]) and adv[0] > 0


def test_finalize_with_a_reward_model_takes_its_scores():
    """reward=model: no host scores; the group advantages of the reward model's scores from collect."""
    grpo = GRPO(num_generations=2)
    grpo.rewards = ModelReward("runs/rm/checkpoints")
    xp = {"completion_mask": jnp.ones((1, 4, 3), jnp.int32), "truncated": jnp.zeros((1, 4), bool),
          "rm_scores": jnp.asarray([[2.0, 0.0, -1.0, -1.0]])}
    out, _, m = grpo.finalize(xp, None, ())
    # groups (2, 0): mean 1, unbiased std sqrt(2); (-1, -1): std 0, advantages 0
    want = [1 / (math.sqrt(2) + 1e-4), -1 / (math.sqrt(2) + 1e-4), 0.0, 0.0]
    np.testing.assert_allclose(np.asarray(out["advantages"])[0], want, rtol=1e-6)
    assert float(m["reward"]) == float(m["rewards/reward_model/mean"]) == 0.0
    assert float(m["frac_reward_zero_std"]) == 0.5
    assert float(m["reward_std"]) == pytest.approx(math.sqrt(6 / 3))  # TRL 1.16: the batch's std, mean 0


def test_a_reward_model_beside_rule_functions_is_one_more_weighted_column():
    """TRL reward_funcs=[fn, model] with reward_weights: the nansum of weight x score per completion."""
    grpo = GRPO(num_generations=2)
    grpo.rewards = ModelReward("runs/rm/checkpoints", rules=Rewards(), weight=2.0)
    scores = jnp.asarray([[[1.0, 1.0], [0.0, np.nan], [np.nan, np.nan], [1.0, 0.0]]])  # accuracy, format
    xp = {"completion_mask": jnp.ones((1, 4, 3), jnp.int32), "truncated": jnp.zeros((1, 4), bool),
          "rm_scores": jnp.asarray([[0.5, -1.0, 0.25, 0.0]])}
    _, _, m = grpo.finalize(xp, scores, ())
    # 1 + 0.5 + 2 x 0.5 = 2.5; 0 + 2 x -1 = -2 (format NaN skipped); 2 x 0.25 = 0.5; 1 + 0 + 0 = 1
    assert float(m["reward"]) == pytest.approx((2.5 - 2 + 0.5 + 1) / 4)
    assert float(m["rewards/reward_model/mean"]) == pytest.approx(-0.25 / 4)
    assert float(m["rewards/accuracy/mean"]) == pytest.approx(2 / 3) and float(m["reward/errors"]) == 3.0


def test_rule_rewards():
    completions = ["19", " 19 ", "it is 21", "", "19.0"]
    assert accuracy([""] * 5, completions, answer=["19", "19", "21", "3", "19"]) == [1.0, 1.0, 1.0, 0.0, 1.0]
    assert accuracy(["a"], ["1"]) == [None]  # no answer column: no reward
    assert format_match([""] * 3, ["19", "19 apples", " -4\n"]) == [1.0, 0.0, 1.0]
    assert length_penalty([""] * 2, ["", "x" * 100], max_length=50) == [0.0, -1.0]


def test_a_gsm8k_solution_is_scored_by_its_final_answer_and_thousands_separators_are_read():
    """GSM8K's answer field is a worked solution ending '#### 72' (TRL's and Tunix's GRPO examples
    take the text after '####'); before, it was compared whole and every completion scored 0."""
    gsm = "Natalia sold 48/2 = 24 clips in May.\nAltogether she sold 48+24 = 72 clips.\n#### 72"
    assert accuracy([""] * 3, ["she sold 72", "#### 72.0", "24"], answer=[gsm] * 3) == [1.0, 1.0, 0.0]
    assert digits([""] * 2, ["72", "12"], answer=[gsm] * 2) == [1.0, 0.5]
    assert accuracy([""] * 3, ["1,000 apples", "1000", "it is 000"], answer=["1,000", "#### 1,000", "1000"]) == [
        1.0, 1.0, 0.0]
    assert accuracy([""], ["1"], answer=["#### "]) == [None]  # an empty final answer: no reward


def test_sampling_keys_are_per_record_and_sample():
    from stack.rollout import sample_keys

    key = jax.random.key(0)
    a = sample_keys(key, jnp.asarray([5, 5, 6]), jnp.asarray([0, 1, 0]))
    b = sample_keys(key, jnp.asarray([6]), jnp.asarray([0]))
    data = np.asarray(jax.random.key_data(a))
    assert (data[0] != data[1]).any() and (data[2] == np.asarray(jax.random.key_data(b))[0]).all()


GRPO_RUN = ["data=jsonl_prompts", "algorithm=grpo", "algorithm.num_generations=4", "algorithm.max_new_tokens=4",
            "data.batch_size=4", "trainer.log_every=1", "trainer.eval_batches=1", "logger=jsonl"]


@pytest.mark.parametrize("mu, filters", [(1, []), (2, []), (1, ["algorithm.top_k=20", "algorithm.top_p=0.9"])])
def test_the_first_iteration_ratio_is_one_and_the_sampler_agrees_with_the_trainer(tmp_path, mu, filters):
    """The first step of a round: the training log-probs (the old ones from collect's forward
    when mu = 2; the current ones when mu = 1, which skips that forward) equal the sampler's,
    so nothing is clipped; with beta > 0 the reference is the initial policy: KL 0 at step 1.
    With top-k/top-p the samples are filtered and the log-probs still those of the unfiltered
    tempered distribution on both sides (TRL GRPOTrainer)."""
    from stack.engine.trainer import train
    from stack.run.build import build
    from tests.helpers import captured, make_cfg

    cfg = make_cfg(GRPO_RUN + ["trainer.steps=2", "algorithm.beta=0.1", f"algorithm.num_iterations={mu}",
                               f"run_dir={tmp_path}", *filters])
    exp, cap = captured(build(cfg, str(tmp_path)))
    summary = train(exp)
    exp.rewards.close()
    first = next(r for r in cap.rows if r["step"] == 1)
    assert first["train/logprob_mismatch"] < 1e-4
    assert first["train/clip_ratio/region_mean"] == 0.0 and abs(first["train/kl"]) < 1e-6
    assert 0 <= summary.eval_at_start["eval/reward"] <= 1 and "eval/rewards/accuracy/mean" in summary.eval
    assert first["train/completions/mean_length"] > 0 and "train/frac_reward_zero_std" in first


def test_tokens_of_a_prompt_batch_count_the_sequences_collect_samples():
    """Throughput and mode=compile's model-formula FLOPs: 8 prompts of 1,024 x 4 completions of up to
    2,048 tokens are 32 sequences of 3,072 (they counted the prompts alone, 3x too few)."""
    prompts = {"prompt_ids": np.zeros((1, 8, 1024), np.int32)}
    assert GRPO(num_generations=4, max_new_tokens=2048).batch_tokens(prompts) == 32 * 3072
    sampled = {"prompt_ids": np.zeros((1, 32, 1024), np.int32), "completion": np.zeros((1, 32, 2048), np.int32)}
    assert GRPO(num_generations=4, max_new_tokens=2048).batch_tokens(sampled) == 32 * 3072
