"""The Optax chain written as a YAML list equals the reference optimizers."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from stack.errors import ConfigError
from stack.optim.chain import make_optimizer
from stack.optim.masks import decay_mask
from stack.optim.schedules import warmup_cosine
from tests.helpers import make_cfg


def params():
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    return {
        "embed": {"embedding": jax.random.normal(k[0], (8, 4))},
        "layers": {"attn_norm": {"scale": jnp.ones(4)}, "q_proj": {"kernel": jax.random.normal(k[1], (4, 4))}},
        "lm_head": {"kernel": jax.random.normal(k[2], (4, 8))},
    }


def grads_at(i):
    return jax.tree.map(lambda p: jnp.sin(p * (i + 1)) + 0.1 * i, params())


def run(tx, n=3):
    p = params()
    state = tx.init(p)
    for i in range(n):
        updates, state = tx.update(grads_at(i), state, p)
        p = optax.apply_updates(p, updates)
    return p


def test_decay_mask_skips_norms_embeddings_biases():
    mask = decay_mask(params())
    assert mask["embed"]["embedding"] is False
    assert mask["layers"]["attn_norm"]["scale"] is False
    assert mask["layers"]["q_proj"]["kernel"] is True and mask["lm_head"]["kernel"] is True


def test_adamw_chain_equals_optax_adamw():
    cfg = make_cfg(["optimizer=adamw", "trainer.steps=10"])
    tx, schedule = make_optimizer(cfg.optimizer)
    o = cfg.optimizer
    ref = optax.chain(
        optax.clip_by_global_norm(o.clip_norm),
        optax.adamw(schedule, b1=o.extra.b1, b2=o.extra.b2, eps=o.extra.eps,
                    weight_decay=o.weight_decay, mask=decay_mask),
    )
    ours, theirs = run(tx), run(ref)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), ours, theirs)


def test_first_adamw_step_by_hand():
    """Step 1 of Adam is g / (|g| + eps) = sign(g); decoupled decay adds wd * p (masked)."""
    cfg = make_cfg(["optimizer=adamw", "optimizer.warmup_steps=0", "optimizer.clip_norm=1e9",
                    "optimizer.lr=0.01", "optimizer.weight_decay=0.5"])
    tx, _ = make_optimizer(cfg.optimizer)
    p, g = params(), grads_at(0)
    updates, _ = tx.update(g, tx.init(p), p)
    kernel, grad = np.asarray(p["lm_head"]["kernel"]), np.asarray(g["lm_head"]["kernel"])
    expected = -0.01 * (grad / (np.abs(grad) + 1e-8) + 0.5 * kernel)
    np.testing.assert_allclose(updates["lm_head"]["kernel"], expected, rtol=1e-5, atol=1e-7)
    gemb = np.asarray(g["embed"]["embedding"])  # embeddings: no weight decay
    np.testing.assert_allclose(updates["embed"]["embedding"], -0.01 * gemb / (np.abs(gemb) + 1e-8), rtol=1e-5)


def test_warmup_cosine_schedule_values():
    s = warmup_cosine(peak_value=1.0, warmup_steps=10, total_steps=110, end_ratio=0.1)
    assert float(s(0)) == 0.0 and float(s(5)) == pytest.approx(0.5)
    assert float(s(10)) == pytest.approx(1.0)
    assert float(s(60)) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * 0.5)), rel=1e-5)
    assert float(s(110)) == pytest.approx(0.1)
    short = warmup_cosine(1.0, warmup_steps=20, total_steps=5)  # warmup capped, still valid
    assert np.isfinite(float(short(3)))


@pytest.mark.parametrize("name", ["sgd", "adafactor", "adamw"])
def test_each_optimizer_minimises_a_quadratic(name):
    cfg = make_cfg([f"optimizer={name}", "trainer.steps=200", "optimizer.warmup_steps=0", "optimizer.lr=0.05"])
    tx, _ = make_optimizer(cfg.optimizer)
    p = {"w": jnp.full((4, 4), 3.0)}
    state = tx.init(p)
    loss = lambda q: jnp.sum(q["w"] ** 2)  # noqa: E731
    for _ in range(200):
        updates, state = tx.update(jax.grad(loss)(p), state, p)
        p = optax.apply_updates(p, updates)
    assert float(loss(p)) < 0.1 * 16 * 9


def test_bad_chain_key_is_a_clear_error():
    cfg = make_cfg(["optimizer=adamw", "+optimizer.chain.1.betas=0.9"])
    with pytest.raises(ConfigError, match=r"optimizer\.chain\.1.*scale_by_adam"):
        make_optimizer(cfg.optimizer)
