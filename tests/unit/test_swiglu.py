"""stack.models.swiglu: the hand-written backward against finite differences and against autodiff
of the same formula (HF LlamaMLP: down(silu(gate(x)) * up(x)))."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from stack.models.swiglu import swiglu
from tests.helpers import assert_same_vjp


def plain(x, gate, up, down):
    return (jax.nn.silu(x @ gate) * (x @ up)) @ down


def operands(dtype=jnp.float32, d=8, f=12, seed=0):
    rng = np.random.default_rng(seed)
    shapes = ((2, 3, d), (d, f), (d, f), (f, d))
    return tuple(jnp.asarray(rng.normal(scale=0.5, size=s), dtype) for s in shapes)


def test_forward_is_the_plain_formula():
    args = operands()
    np.testing.assert_allclose(np.asarray(swiglu(*args)), np.asarray(plain(*args)), rtol=1e-6, atol=1e-6)


def test_backward_matches_finite_differences():
    check_grads(swiglu, operands(), order=1, modes=("rev",), eps=1e-3, atol=2e-2, rtol=2e-2)


def test_backward_matches_autodiff_of_the_plain_formula():
    args = operands(seed=1)
    cotangent = jnp.asarray(np.random.default_rng(2).normal(size=(2, 3, 8)), jnp.float32)
    assert_same_vjp(swiglu, plain, args, cotangent)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_gradients_keep_the_operand_dtypes(dtype):
    args = operands(dtype)
    grads = jax.grad(lambda *a: swiglu(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2, 3))(*args)
    assert [g.dtype for g in grads] == [dtype] * 4
    assert [g.shape for g in grads] == [a.shape for a in args]
