"""DPO numerics against hand computations, the published formulas (NumPy), and masking."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stack.algorithms.base import Context
from stack.algorithms.dpo import DPO, dpo_loss, sequence_logps
from stack.config.schema import shipped_data
from stack.data.encode import Encoder
from stack.data.tokenizers import ByteTokenizer
from stack.models.init import init_model
from stack.quant.providers import NoQuantization
from tests.helpers import FixedLogits, loss_of, make_cfg, models


def log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


NUMPY = {  # TRL's formulas, written independently in NumPy
    "sigmoid": lambda d, b, e: -(1 - e) * log_sigmoid(b * d) - e * log_sigmoid(-b * d),
    "hinge": lambda d, b, e: np.maximum(0.0, 1 - b * d),
    "ipo": lambda d, b, e: (d - 1 / (2 * b)) ** 2,
    "robust": lambda d, b, e: (-(1 - e) * log_sigmoid(b * d) + e * log_sigmoid(-b * d)) / (1 - 2 * e),
}


def test_golden_deltas():
    """Log-ratio differences [0, 10, 20] with beta 0.1 give -log sigmoid([0, 1, 2])."""
    zeros = jnp.zeros(3)
    got = dpo_loss(jnp.array([0.0, 10.0, 20.0]), zeros, zeros, zeros, beta=0.1)
    want = [-math.log(1 / (1 + math.exp(-x))) for x in (0.0, 1.0, 2.0)]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


@pytest.mark.parametrize("loss_type,eps", [(t, 0.0) for t in NUMPY] + [("sigmoid", 0.2), ("robust", 0.2)])
def test_each_loss_type_matches_numpy(loss_type, eps):
    rng = np.random.default_rng(0)
    pc, pr, rc, rr = (rng.normal(scale=5.0, size=16) for _ in range(4))
    got = dpo_loss(*map(jnp.asarray, (pc, pr, rc, rr)), beta=0.3, loss_type=loss_type, label_smoothing=eps)
    want = NUMPY[loss_type]((pc - pr) - (rc - rr), 0.3, eps)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def pair_batch(b=2, t=6, v=7, seed=0):
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, v, size=(b, 2, t)).astype(np.int32)
    mask = np.zeros((b, 2, t), np.float32)
    mask[0, 0, 2:5] = 1  # chosen of pair 0: 3 completion tokens
    mask[0, 1, 2:4] = 1  # rejected of pair 0: 2
    mask[1, 0, 3:6] = 1
    mask[1, 1, 1:6] = 1
    return {"inputs": targets, "targets": targets, "loss_mask": mask}, rng.normal(size=(2 * b, t, v)).astype(np.float32)


def hand_logps(logits, batch):
    """Sum of completion-token log-probs per folded row (float64 by hand)."""
    flat_t = batch["targets"].reshape(-1, batch["targets"].shape[-1])
    flat_m = batch["loss_mask"].reshape(flat_t.shape)
    out = []
    for row, (lg, tg, m) in enumerate(zip(logits.astype(np.float64), flat_t, flat_m, strict=True)):
        logz = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
        out.append(sum((lg[j, tg[j]] - logz[j]) for j in range(len(tg)) if m[j]))
    return np.array(out)


def experience(dpo: DPO, batch: dict, policy, reference) -> dict:
    """DPO's `collect` on one micro-batch: the batch plus the reference's `ref_logps`."""
    stacked = jax.tree.map(lambda x: jnp.asarray(x)[None], batch)
    xp = dpo.collect(models(policy), models(None, reference=reference), (), stacked, jax.random.key(0), True)
    return jax.tree.map(lambda x: x[0], xp)


def run_loss(kw: dict, batch, policy_logits, ref_logits):
    dpo = DPO(**kw)
    xp = experience(dpo, batch, FixedLogits(policy_logits), FixedLogits(ref_logits))
    return loss_of(dpo, FixedLogits(policy_logits), xp)


def test_sequence_logps_sum_completion_tokens_only():
    batch, logits = pair_batch()
    flat = {k: v.reshape(-1, v.shape[-1]) for k, v in batch.items()}
    got, count = sequence_logps(jnp.asarray(logits), flat["targets"], flat["loss_mask"])
    np.testing.assert_allclose(np.asarray(got), hand_logps(logits, batch), rtol=1e-5)
    assert np.asarray(count).tolist() == [3, 2, 3, 5]


def test_loss_and_trl_metrics_by_hand():
    batch, policy = pair_batch(seed=1)
    _, ref = pair_batch(seed=2)
    loss, m = run_loss(dict(beta=0.2), batch, policy, ref)
    p, r = hand_logps(policy, batch), hand_logps(ref, batch)
    chosen, rejected = 0.2 * (p[0::2] - r[0::2]), 0.2 * (p[1::2] - r[1::2])
    assert float(loss) == pytest.approx(np.mean(-log_sigmoid(chosen - rejected)), rel=1e-5)
    assert float(m["rewards/chosen"]) == pytest.approx(chosen.mean(), rel=1e-5)
    assert float(m["rewards/rejected"]) == pytest.approx(rejected.mean(), rel=1e-5)
    assert float(m["rewards/margins"]) == pytest.approx((chosen - rejected).mean(), rel=1e-5)
    assert float(m["rewards/accuracies"]) == np.mean(chosen > rejected)
    assert float(m["logps/chosen"]) == pytest.approx(p[0::2].mean(), rel=1e-5)
    assert float(m["logps/rejected"]) == pytest.approx(p[1::2].mean(), rel=1e-5)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_precomputed_ref_logps_in_the_batch_replace_the_reference_forward(loss_type):
    batch, policy = pair_batch(seed=9)
    _, ref = pair_batch(seed=10)
    want, want_m = run_loss(dict(loss_type=loss_type), batch, policy, ref)
    given = dict(batch, ref_logps=hand_logps(ref, batch).reshape(-1, 2).astype(np.float32))  # [pairs, 2]
    got, got_m = run_loss(dict(loss_type=loss_type), given, policy, ref * 0 + 100.0)  # the forward is not used
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    assert float(got_m["rewards/margins"]) == pytest.approx(float(want_m["rewards/margins"]), rel=1e-5)
    cols = experience(DPO(), batch, None, FixedLogits(ref))["ref_logps"]
    np.testing.assert_allclose(np.asarray(cols), given["ref_logps"], rtol=1e-5)
    passed = experience(DPO(), given, None, None)  # precomputed: collect passes the batch through
    np.testing.assert_array_equal(np.asarray(passed["ref_logps"]), given["ref_logps"])


def test_ipo_normalises_by_completion_length():
    batch, policy = pair_batch(seed=3)
    _, ref = pair_batch(seed=4)
    loss, _ = run_loss(dict(beta=0.5, loss_type="ipo"), batch, policy, ref)
    n = np.array([3, 2, 3, 5])
    p, r = hand_logps(policy, batch) / n, hand_logps(ref, batch) / n
    delta = (p[0::2] - p[1::2]) - (r[0::2] - r[1::2])
    assert float(loss) == pytest.approx(np.mean((delta - 1 / (2 * 0.5)) ** 2), rel=1e-5)


def test_sft_weight_adds_chosen_token_nll():
    batch, policy = pair_batch(seed=5)
    _, ref = pair_batch(seed=6)
    base, _ = run_loss({}, batch, policy, ref)
    with_sft, _ = run_loss(dict(sft_weight=0.5), batch, policy, ref)
    p = hand_logps(policy, batch)
    assert float(with_sft - base) == pytest.approx(0.5 * -p[0::2].sum() / 6, rel=1e-5)  # 3 + 3 tokens


def test_masked_tokens_cannot_leak():
    batch, policy = pair_batch(seed=7)
    _, ref = pair_batch(seed=8)
    loss, _ = run_loss({}, batch, policy, ref)
    m = batch["loss_mask"].reshape(-1, batch["loss_mask"].shape[-1])[..., None] > 0
    changed = dict(batch, targets=np.where(batch["loss_mask"] > 0, batch["targets"], 0))
    loss2, _ = run_loss({}, changed, np.where(m, policy, 50.0), np.where(m, ref, -50.0))
    assert float(loss2) == pytest.approx(float(loss), rel=1e-6)


def test_policy_equal_to_reference_gives_ln2_on_a_real_model():
    cfg = make_cfg(["algorithm=dpo", "data=jsonl_prefs"])
    model = init_model(cfg.model, 0)
    dpo = DPO()
    reference = dpo.setup(model, Context(NoQuantization())).frozen["reference"]
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 200, size=(4, 2, 16)).astype(np.int32)
    mask = (rng.random((4, 2, 16)) > 0.5).astype(np.float32)
    xp = experience(dpo, {"inputs": tokens, "targets": tokens, "loss_mask": mask}, model, reference)
    loss, m = loss_of(dpo, model, xp)
    assert float(loss) == pytest.approx(0.6931471824645996, abs=1e-6)
    assert float(m["rewards/accuracies"]) == 0.0 and float(m["rewards/margins"]) == 0.0


def encoded_pairs(n: int, **kw) -> dict:
    """The first n shipped preference pairs as one batch, rows of 64 tokens."""
    rows = [Encoder("preference", ByteTokenizer(), "simple", 64, "keep_start", **kw)(json.loads(line))
            for line in open(shipped_data("prefs_train.jsonl")).readlines()[:n]]
    return {k: jnp.asarray(np.stack([r[k] for r in rows])) for k in rows[0] if k != "margin"}


@pytest.mark.parametrize("layout", [dict(max_completion_len=8), dict(max_completion_len=8, share_prompt=True)])
def test_the_head_at_completion_positions_gives_the_full_heads_loss_and_gradients(layout):
    """data.max_completion_len=8 (every shipped completion fits), with or without the prompt shared
    by both completions: the same loss, metrics and gradients as separate rows with a full head."""
    cfg = make_cfg(["algorithm=dpo", "data=jsonl_prefs"])
    dpo, policy = DPO(), init_model(cfg.model, 0)
    reference = init_model(cfg.model, 1)
    full, cut = encoded_pairs(12), encoded_pairs(12, **layout)
    assert cut["completion_positions"].shape == (12, 2, 8)
    assert cut["inputs"].shape == ((12, 72) if "share_prompt" in layout else (12, 2, 64))

    @nnx.jit  # one compiled program per layout (op by op, each operation compiled on its own)
    def loss_and_grads(batch, policy, reference):
        xp = experience(dpo, batch, policy, reference)
        def loss(m):
            (num, den), metrics = dpo.loss(models(m), xp, None, (), None)
            return num / den, metrics

        (value, metrics), grads = nnx.value_and_grad(loss, has_aux=True)(policy)
        return value, metrics, jax.tree.leaves(grads)

    (want, want_m, want_g), (got, got_m, got_g) = (loss_and_grads(b, policy, reference) for b in (full, cut))
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    for k in set(want_m) - {"packing_efficiency"}:  # the real positions' share of a row: its layout's
        np.testing.assert_allclose(np.asarray(got_m[k]), np.asarray(want_m[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    for g, w in zip(got_g, want_g, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-6)
