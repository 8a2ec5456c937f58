"""SwiGLU feed-forward with a hand-written backward (Shazeer 2020, "GLU Variants Improve
Transformer"; as HF LlamaMLP: down(silu(gate(x)) * up(x))).

The forward computes gate and up as one product of the two kernels stacked, [D, 2, F]. Autodiff
of that product's slices pads both halves' cotangents back into [.., 2, F] and transposes the
sum for the weight gradients; the backward here takes gate's and up's cotangents as they are,
in four products, which is faster on CPU than autodiff of the same forward. The gradients are
those of autodiff up to float rounding (tests/unit/test_swiglu.py).

XLA:CPU feeds a weight gradient's product the token-major operand transposed, as a copy. The down
kernel's gradient is therefore taken as (dy^T h)^T: the copy is of dy [N, D], not of h = silu(g)·u
[N, F] (for F > D the larger one, whose transposing copy XLA fused with the product silu(g)·u and
made the layer slower)."""

import jax
import jax.numpy as jnp

Array = jax.Array


def _gate_up(x: Array, gate: Array, up: Array) -> tuple[Array, Array]:
    gu = jnp.einsum("...d,dkf->...kf", x, jnp.stack([gate, up], 1))
    return gu[..., 0, :], gu[..., 1, :]


@jax.custom_vjp
def swiglu(x: Array, gate: Array, up: Array, down: Array) -> Array:
    """x [..., D] with kernels gate, up [D, F] and down [F, D] -> [..., D]."""
    g, u = _gate_up(x, gate, up)
    return (jax.nn.silu(g) * u) @ down


def _forward(x: Array, gate: Array, up: Array, down: Array) -> tuple[Array, tuple]:
    g, u = _gate_up(x, gate, up)
    return (jax.nn.silu(g) * u) @ down, (x, gate, up, down, g, u)


def _backward(res: tuple, dy: Array) -> tuple[Array, Array, Array, Array]:
    """d silu(g) / dg = sigmoid(g) · (1 + g · (1 - sigmoid(g)))."""
    x, gate, up, down, g, u = res
    sig = jax.nn.sigmoid(g)
    silu = g * sig
    dh = dy @ down.T
    d_down = jnp.einsum("...d,...f->df", dy, silu * u).T  # see the module docstring
    dg, du = dh * u * sig * (1 + g * (1 - sig)), dh * silu
    d_gate, d_up = jnp.einsum("...d,...f->df", x, dg), jnp.einsum("...d,...f->df", x, du)
    return dg @ gate.T + du @ up.T, d_gate, d_up, d_down


swiglu.defvjp(_forward, _backward)
