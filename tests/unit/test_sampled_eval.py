"""Sampled evaluation (stack.algorithms.sampled_eval): pass@k against its definition (the mean over
every k-subset of a prompt's samples of "one is right", Chen et al. 2021), maj@k against a
Counter vote, the greedy/sample row layout of eval_rollout, and the `eval` keys' errors."""

import itertools
import math
from collections import Counter
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stack.algorithms.sampled_eval import (
    EvalSampling,
    answer_ids,
    eval_metrics,
    eval_rollout,
    eval_sampling,
    ks,
    majority_right,
    pass_at_k,
)
from stack.config.validate import validate
from stack.errors import ConfigError
from stack.rewards.functions import final_answer
from stack.rollout import Sampling
from tests.helpers import make_cfg


def test_pass_at_k_is_the_mean_over_k_subsets_that_hold_a_right_sample():
    for n, c, k in [(8, 0, 1), (8, 1, 1), (8, 3, 2), (8, 5, 4), (8, 8, 8), (5, 2, 4), (4, 1, 4)]:
        right = np.arange(n) < c
        subsets = list(itertools.combinations(range(n), k))
        reference = np.mean([right[list(s)].any() for s in subsets])
        assert abs(float(pass_at_k(jnp.asarray(right), k)) - reference) < 1e-6, (n, c, k)
        assert abs(reference - (1 - math.comb(n - c, k) / math.comb(n, k))) < 1e-12


def test_majority_by_hand():
    nan = np.nan
    answers = jnp.asarray([1.0, 2.0, 2.0, nan, 1.0, 1.0])
    right = jnp.asarray([True, False, False, False, True, True])
    got = [bool(majority_right(answers, right, k)) for k in range(1, 7)]
    # k=1: 1 alone; k=2: a tie, the first sampled (1) wins; k=3,4: 2 (twice); k=5: 1-1 tie of 2x2 -> the first (1)
    assert got == [True, True, False, False, True, True]
    assert not bool(majority_right(jnp.asarray([nan, nan]), jnp.asarray([True, True]), 2))  # no votes: not right


def test_answer_ids_name_each_answer_by_its_first_sample():
    completions = ["greedy 3", "x = 3", "5", "so 3", "", [{"role": "assistant", "content": "5"}],
                   "g", "7", "7", "x", "7 8", "8"]
    out = answer_ids(completions, 6)  # two prompts of greedy + 5 samples
    np.testing.assert_array_equal(out, [np.nan, 1, 2, 1, np.nan, 2, np.nan, 1, 1, 3, 4, 4])
    assert ks(8) == [1, 2, 4, 8] and ks(6) == [1, 2, 4, 6] and ks(1) == [1]


def reference_metrics(texts, right, n):
    """pass@k and maj@k of prompts [P, n] of sample texts and right/wrong (NaN: unscored), from the definitions."""
    out = {}
    scored = [p for p in range(len(texts)) if not np.all(np.isnan(right[p]))]
    for k in ks(n):
        passes, majorities = [], []
        for p in scored:
            ok = np.nan_to_num(right[p]) >= 1
            passes.append(np.mean([ok[list(s)].any() for s in itertools.combinations(range(n), k)]))
            answers = [final_answer(t) for t in texts[p][:k]]
            votes = Counter(a for a in answers if a is not None)
            if not votes:
                majorities.append(0.0)
                continue
            top = max(votes.values())
            winner = next(a for a in answers if a is not None and votes[a] == top)
            majorities.append(float(ok[answers.index(winner)]))
        out[f"pass@{k}"], out[f"maj@{k}"] = np.mean(passes), np.mean(majorities)
    return out


def test_eval_metrics_against_the_definitions():
    rng = np.random.default_rng(0)
    m, prompts, n = 2, 3, 6
    texts = rng.choice(["a 1", "2", "b 2", "3", "", "1"], size=(m, prompts, 1 + n))
    right = rng.choice([0.0, 1.0, np.nan], p=[0.5, 0.4, 0.1], size=(m, prompts, 1 + n))
    right[1, 2] = np.nan  # a prompt nobody scored (no reference answer): left out
    ids = answer_ids(texts.reshape(-1).tolist(), 1 + n).reshape(m, prompts, 1 + n)
    scores = np.stack([right, 0.5 * np.ones_like(right), ids], -1).reshape(m, prompts * (1 + n), 3)
    lengths = rng.integers(1, 5, size=(m, prompts * (1 + n)))
    xp = {"completion_mask": (np.arange(4) < lengths[..., None]).astype(np.int32),
          "truncated": (lengths == 4).astype(np.int32), "sample_number": np.tile(np.arange(1 + n), (m, prompts))}
    rules = SimpleNamespace(names=["right", "half"], weights=np.asarray([1.0, 1.0], np.float32))
    got = eval_metrics(rules, jax.tree.map(jnp.asarray, xp), jnp.asarray(scores, jnp.float32),
                       EvalSampling(Sampling(4), n, Sampling(4, 1.0), correct=0))
    reference = reference_metrics(texts[:, :, 1:].reshape(-1, n), right[:, :, 1:].reshape(-1, n), n)
    for key, value in reference.items():
        assert abs(float(got[key]) - value) < 1e-6, key
    greedy = right[:, :, 0][~np.isnan(right[:, :, 0])]  # greedy completions a function scored
    assert abs(float(got["accuracy"]) - np.mean(greedy >= 1)) < 1e-6
    assert abs(float(got["reward"]) - np.nanmean(np.nan_to_num(right[:, :, 0]) + 0.5)) < 1e-6  # greedy rows only
    assert abs(float(got["completions/mean_length"]) - lengths.reshape(m, prompts, 1 + n)[:, :, 0].mean()) < 1e-6


def test_eval_rollout_lays_out_the_greedy_completion_then_the_samples_of_each_prompt():
    from stack.algorithms.onpolicy import rollout
    from stack.config.schema.model import ModelConfig
    from stack.models.init import init_model

    policy = init_model(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64,
                                    max_seq_len=32), 0)
    ids = np.array([[0, 3, 4, 5], [6, 7, 8, 9]], np.int32)
    b = {"prompt_ids": jnp.asarray(ids), "prompt_mask": jnp.asarray(ids > 0, jnp.int32), "index": jnp.asarray([4, 9])}
    ev = eval_sampling(SimpleNamespace(num_samples=3, temperature=2.0, correct=None), Sampling(5, 1.0), None)
    key = jax.random.key(1)
    out = eval_rollout(policy, b, key, ev)
    greedy = rollout(policy, b, key, jnp.zeros(2, jnp.int32), Sampling(5, 0.0))
    many = jax.tree.map(lambda x: jnp.repeat(x, 3, axis=0), b)
    sampled = rollout(policy, many, key, jnp.asarray([1, 2, 3, 1, 2, 3]), Sampling(5, 2.0))
    tokens = np.asarray(out["completion"]).reshape(2, 4, 5)
    np.testing.assert_array_equal(tokens[:, 0], greedy["completion"])
    np.testing.assert_array_equal(tokens[:, 1:].reshape(6, 5), sampled["completion"])
    np.testing.assert_array_equal(out["sample_number"], [0, 1, 2, 3, 0, 1, 2, 3])
    np.testing.assert_array_equal(np.asarray(out["index"]), [4, 4, 4, 4, 9, 9, 9, 9])
    assert len({tuple(t) for t in tokens[0, 1:]}) > 1  # at temperature 2 the samples differ


GRPO = ["algorithm=grpo", "data=jsonl_prompts"]


@pytest.mark.parametrize("overrides, match", [
    (["eval.num_samples=4"], "algorithm='sft' evaluates its loss"),
    ([*GRPO, "eval.num_samples=-1"], "null or 0"),
    ([*GRPO, "eval.num_samples=4", "eval.temperature=0"], "'eval.temperature'=0.0 must be > 0"),
    ([*GRPO, "eval.num_samples=4", "reward.functions=[digits]"], r"reward function 'accuracy' .* lacks"),
    ([*GRPO, "eval.correct=format"], r"'eval.correct' names the reward function 'format'"),
])
def test_bad_eval_keys_are_one_clear_error(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(make_cfg(overrides))


def test_the_shipped_grpo_and_ppo_recipes_take_eval_samples():
    for recipe in ("llama_grpo", "llama_ppo"):
        validate(make_cfg([f"+recipe={recipe}", "eval.num_samples=8", "eval.temperature=0.7"]))


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_a_run_reports_pass_and_maj_at_k_beside_the_greedy_accuracy(tmp_path, algorithm):
    """Through the trainer's eval (collect, host scores with the answer column, evaluate): the
    greedy metrics as without samples, pass@k rising with k, maj@k of the same k."""
    from stack.engine.trainer import train
    from stack.run.build import build
    from tests.helpers import captured

    cfg = make_cfg([f"algorithm={algorithm}", "data=jsonl_prompts", "algorithm.max_new_tokens=4", "data.batch_size=4",
                    "trainer.steps=1", "trainer.eval_batches=1", "eval.num_samples=4", "logger=[]",
                    *(["algorithm.num_generations=4"] if algorithm == "grpo" else ["algorithm.num_ppo_epochs=1"]),
                    f"run_dir={tmp_path}"])
    exp, _ = captured(build(cfg, str(tmp_path)))
    summary = train(exp)
    exp.rewards.close()
    ev = summary.eval
    assert ev["eval/accuracy"] == ev["eval/rewards/accuracy/mean"]  # accuracy's scores are 0 or 1
    assert [ev[f"eval/pass@{k}"] for k in (1, 2, 4)] == sorted(ev[f"eval/pass@{k}"] for k in (1, 2, 4))
    assert {f"eval/maj@{k}" for k in (1, 2, 4)} <= set(ev)
