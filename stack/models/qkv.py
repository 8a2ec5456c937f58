"""The attention's query, key and value projections as one product, with a hand-written backward.

The forward multiplies by the three kernels concatenated at call time, [D, Fq + Fk + Fv] (params keep
HF's layout), and slices the result. Autodiff of those slices pads each cotangent back to the whole
width and sums them; the backward here takes the three cotangents as they are: the input's gradient
as the sum of three products, each kernel's gradient as its own product. On CPU this is faster than
three separate products and than autodiff of the concatenated product. The gradients are autodiff's
of the three products up to float rounding (tests/unit/test_qkv.py)."""

import jax
import jax.numpy as jnp

Array = jax.Array


def _project(x: Array, wq: Array, wk: Array, wv: Array) -> tuple[Array, Array, Array]:
    fq, fk = wq.shape[1], wk.shape[1]
    y = x @ jnp.concatenate([wq, wk, wv], axis=1)
    return y[..., :fq], y[..., fq:fq + fk], y[..., fq + fk:]


@jax.custom_vjp
def qkv(x: Array, wq: Array, wk: Array, wv: Array) -> tuple[Array, Array, Array]:
    """x [..., D] with kernels wq [D, Fq], wk [D, Fk], wv [D, Fv] -> (x @ wq, x @ wk, x @ wv)."""
    return _project(x, wq, wk, wv)


def _forward(x: Array, wq: Array, wk: Array, wv: Array) -> tuple[tuple[Array, Array, Array], tuple]:
    return _project(x, wq, wk, wv), (x, wq, wk, wv)


def _backward(res: tuple, dys: tuple[Array, Array, Array]) -> tuple[Array, Array, Array, Array]:
    x, *kernels = res
    dx = sum(dy @ w.T for dy, w in zip(dys, kernels, strict=True))
    return (dx, *(jnp.einsum("...d,...f->df", x, dy) for dy in dys))


qkv.defvjp(_forward, _backward)
