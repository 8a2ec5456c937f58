"""Helpers on whole modules: copy one, ask whether it is shape-only (mode=compile)."""

import jax
import jax.numpy as jnp
from flax import nnx


def is_abstract(module: nnx.Module) -> bool:
    """True when `module`'s leaves are ShapeDtypeStructs (built by `nnx.eval_shape`)."""
    return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(nnx.state(module)))


def copy_module(module: nnx.Module) -> nnx.Module:
    """A copy of `module` with its own arrays (shape-only leaves stay as they are)."""
    graphdef, state = nnx.split(module)
    return nnx.merge(graphdef, jax.tree.map(lambda x: jnp.copy(x) if isinstance(x, jax.Array) else x, state))
