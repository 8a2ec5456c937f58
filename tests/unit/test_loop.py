"""The generic loop: accumulation equals a big batch, syncs only when logging, one compile."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import stack.loop as loop
from stack.algorithms.sft import SFT
from stack.build import build, make_optimizer
from tests.conftest import make_cfg

TINY = ["model.d_model=32", "model.n_heads=2", "model.n_kv_heads=1", "model.d_ff=64",
        "model.n_layers=1", "data.batch_size=8", "trainer.eval_batches=1", "logger=jsonl"]


def random_batch(n: int, seq: int = 12, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, 259, size=(n, seq + 1)).astype(np.int32)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "loss_mask": np.ones((n, seq), np.float32)}


def one_update(accum: int, micro: int, cfg) -> dict:
    model = build(cfg, cfg.run_dir).model
    tx, _ = make_optimizer(cfg.optimizer, grad_accum=accum)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    step = jax.jit(loop.make_train_step(graphdef, SFT(), tx))
    opt_state = tx.init(params)
    batch = random_batch(accum * micro)
    for i in range(accum):
        part = {k: v[i * micro:(i + 1) * micro] for k, v in batch.items()}
        params, opt_state, _ = step(params, opt_state, rest, part, None)
    return nnx.to_pure_dict(params)


def test_grad_accumulation_4x2_equals_batch_of_8(tmp_path):
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", "optimizer.warmup_steps=0"])
    accumulated, full = one_update(4, 2, cfg), one_update(1, 8, cfg)
    initial = nnx.to_pure_dict(nnx.state(build(cfg, cfg.run_dir).model, nnx.Param))
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), full, initial)
    assert max(jax.tree.leaves(moved)) > 1e-4, "the update did not move the params"
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=0), accumulated, full)


def test_loop_syncs_only_at_logging_steps(tmp_path, monkeypatch):
    """No implicit device->host transfer anywhere; explicit ones only when logging or evaluating."""
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", "trainer.steps=12", "trainer.log_every=4",
                           "trainer.eval_every=6"])
    exp = build(cfg, str(tmp_path))
    calls = []
    real_mean = loop._mean
    monkeypatch.setattr(loop, "_mean", lambda window, prefix: calls.append(prefix) or real_mean(window, prefix))
    with jax.transfer_guard_device_to_host("disallow"):
        loop.train(exp)
    # train: steps 4, 8, 12; eval: steps 0, 6, 12
    assert calls.count("train/") == 3 and calls.count("eval/") == 3


def test_step_compiles_once_with_grad_accum(tmp_path, caplog):
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", "trainer.steps=6", "trainer.grad_accum=2",
                           "trainer.log_every=2", "trainer.eval_every=3"])
    exp = build(cfg, str(tmp_path))
    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level(logging.WARNING):
            loop.train(exp)
    finally:
        jax.config.update("jax_log_compiles", False)
    compiles = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    assert sum("Compiling jit(step)" in m for m in compiles) == 1, compiles
    assert sum("Compiling jit(evaluate)" in m for m in compiles) == 1, compiles


def test_lr_logged_follows_schedule(tmp_path):
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", "trainer.steps=10", "trainer.log_every=5",
                           "optimizer.warmup_steps=4"])
    exp = build(cfg, str(tmp_path))
    loop.train(exp)
    for sink in exp.sinks:
        sink.close()
    rows = [r for r in map(__import__("json").loads, open(tmp_path / "metrics.jsonl")) if "train/lr" in r]
    assert [r["step"] for r in rows] == [5, 10]
    assert rows[0]["train/lr"] == float(exp.schedule(4))
    assert rows[0]["train/lr"] == pytest.approx(cfg.optimizer.lr, rel=1e-6)  # warmup ends at step 4


def test_nan_loss_stops_the_run(tmp_path):
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", "trainer.steps=4", "trainer.log_every=1",
                           "optimizer.lr=nan", "optimizer.warmup_steps=0"])
    exp = build(cfg, str(tmp_path))
    try:
        loop.train(exp)
    except loop.NonFiniteLoss as exc:
        assert "step 2" in str(exc) and "nan_policy" in str(exc)
    else:
        raise AssertionError("a NaN loss did not stop the run")
