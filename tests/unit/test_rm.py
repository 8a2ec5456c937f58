"""The reward model: the Bradley–Terry loss against hand numbers (TRL RewardTrainer's formula),
the score read at the last real token against transformers' LlamaForSequenceClassification,
and `score_texts` against the scores the loss sees."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stack.algorithms.rm import RewardModel, bradley_terry, sequence_scores
from stack.models.heads import ScalarHead
from stack.rewards.model import pair_rows
from tests.helpers import models


def test_bradley_terry_by_hand():
    c, r = jnp.asarray([1.0, 0.0]), jnp.asarray([0.0, 2.0])
    # -log sigmoid(x) = log(1 + exp(-x)): x = 1 and x = -2
    np.testing.assert_allclose(bradley_terry(c, r), [math.log1p(math.exp(-1)), math.log1p(math.exp(2))], rtol=1e-6)
    np.testing.assert_allclose(bradley_terry(c, r, jnp.asarray([0.5, 0.0])),
                               [math.log1p(math.exp(-0.5)), math.log1p(math.exp(2))], rtol=1e-6)
    # centering: + 0.1 (r_c + r_r)^2 = + 0.1 and + 0.4
    np.testing.assert_allclose(bradley_terry(c, r, 0.0, 0.1),
                               [math.log1p(math.exp(-1)) + 0.1, math.log1p(math.exp(2)) + 0.4], rtol=1e-6)


class FixedScores:
    """A trunk whose features make the head's score of row i equal `scores[i]` at every position."""

    def __init__(self, scores):
        self.scores = jnp.asarray(scores, jnp.float32)

    def __call__(self, tokens, positions, segments, features):
        return jnp.broadcast_to(self.scores[:, None, None], (*tokens.shape, 1))


def test_loss_and_metrics_of_two_pairs():
    head = ScalarHead(1)
    head.kernel[...] = jnp.ones((1, 1))
    batch = {"inputs": np.ones((2, 2, 4), np.int32), "targets": np.ones((2, 2, 4), np.int32),
             "segment_ids": np.ones((2, 2, 4), np.int32), "margin": np.zeros(2, np.float32)}
    # rows c0, r0, c1, r1 score 2, 1, 0, 3: pair 0 right (margin 1), pair 1 wrong (margin -3)
    terms, metrics = RewardModel().loss(models(FixedScores([2.0, 1.0, 0.0, 3.0]), score=head), batch, None, (),
                                        jax.random.key(0))
    loss = float(terms[0] / terms[1])
    assert loss == pytest.approx((math.log1p(math.exp(-1)) + math.log1p(math.exp(3))) / 2, rel=1e-6)
    assert float(metrics["accuracy"]) == 0.5 and float(metrics["margin"]) == pytest.approx(-1.0)
    assert float(metrics["rewards/chosen"]) == pytest.approx(1.0) and float(metrics["rewards/rejected"]) == 2.0


def test_score_is_read_at_the_last_real_token_as_transformers_does():
    transformers = pytest.importorskip("transformers", reason="the RM head is checked against transformers")
    torch = pytest.importorskip("torch", reason="the RM head is checked against transformers (torch CPU)")
    import tempfile

    from stack.models.hf import load_hf_weights
    from tests.unit.test_hf import hf_model, our_cfg, randomized

    hf = hf_model()
    cfg = our_cfg()
    trunk = randomized(cfg)  # then the HF trunk's weights, loaded through our importer below

    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        load_hf_weights(trunk, cfg, d)
        seq_cls = transformers.LlamaForSequenceClassification.from_pretrained(d, num_labels=1, pad_token_id=0)
    seq_cls = seq_cls.float().eval()
    head = ScalarHead(cfg.d_model, seed=3)
    with torch.no_grad():
        seq_cls.score.weight.copy_(torch.from_numpy(np.asarray(head.kernel[...]).T.copy()))
    rng = np.random.default_rng(0)
    lengths = [9, 5, 12]
    ids = np.zeros((3, 12), np.int32)  # right-padded with pad id 0
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(1, 97, n)
    segments = (ids > 0).astype(np.int32)
    ours = nnx.jit(lambda t, h, x, s: sequence_scores(t, h, x, s))(trunk, head, jnp.asarray(ids), jnp.asarray(segments))
    with torch.no_grad():
        theirs = seq_cls(torch.from_numpy(ids.astype(np.int64)), attention_mask=torch.from_numpy(segments)).logits
    np.testing.assert_allclose(np.asarray(ours), theirs[:, 0].numpy(), atol=1e-4)


def test_pair_rows_rebuild_the_whole_sequence():
    # one pair of rows (BOS=1, a, b, EOS=2) right-padded to 5 inputs: inputs = tokens[:-1], targets = tokens[1:]
    tokens = np.array([[1, 5, 6, 2, 0, 0], [1, 7, 2, 0, 0, 0]], np.int32)
    batch = {"inputs": tokens[None, :, :-1], "targets": tokens[None, :, 1:],
             "segment_ids": np.array([[[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]], np.int32)}
    seq, seg = pair_rows({k: jnp.asarray(v) for k, v in batch.items()})
    np.testing.assert_array_equal(np.asarray(seq), tokens)
    np.testing.assert_array_equal(np.asarray(seg), [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]])
