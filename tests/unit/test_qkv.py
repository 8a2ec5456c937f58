"""stack.models.qkv: the one-product Q, K, V projections and their hand-written backward against
finite differences and against autodiff of the three plain products."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from stack.models.qkv import qkv
from tests.helpers import assert_same_vjp


def plain(x, wq, wk, wv):
    return x @ wq, x @ wk, x @ wv


def operands(dtype=jnp.float32, d=8, fq=12, fk=6, seed=0):
    rng = np.random.default_rng(seed)
    shapes = ((2, 3, d), (d, fq), (d, fk), (d, fk))
    return tuple(jnp.asarray(rng.normal(scale=0.5, size=s), dtype) for s in shapes)


def test_forward_is_the_three_products():
    args = operands()
    for got, want in zip(qkv(*args), plain(*args), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_backward_matches_finite_differences():
    check_grads(lambda *a: jnp.concatenate(qkv(*a), -1), operands(), order=1, modes=("rev",),
                eps=1e-3, atol=2e-2, rtol=2e-2)


def test_backward_matches_autodiff_of_the_three_products():
    args = operands(seed=1)
    rng = np.random.default_rng(2)
    cotangents = tuple(jnp.asarray(rng.normal(size=y.shape), jnp.float32) for y in plain(*args))
    assert_same_vjp(qkv, plain, args, cotangents)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_gradients_keep_the_operand_dtypes(dtype):
    args = operands(dtype)
    grads = jax.grad(lambda *a: sum(y.astype(jnp.float32).sum() for y in qkv(*a)), argnums=(0, 1, 2, 3))(*args)
    assert [g.dtype for g in grads] == [dtype] * 4
    assert [g.shape for g in grads] == [a.shape for a in args]
