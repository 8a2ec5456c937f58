"""Helpers on whole modules: copy one, ask whether it is shape-only (mode=compile)."""

import jax
import jax.numpy as jnp
from flax import nnx


def is_abstract(module: nnx.Module) -> bool:
    """True when `module`'s leaves are ShapeDtypeStructs (built by `nnx.eval_shape`)."""
    return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(nnx.state(module)))


def copy_module(module: nnx.Module) -> nnx.Module:
    """A copy of `module` with its own arrays, each sharded as its original (other leaves, e.g.
    shape-only ones, stay as they are). One jitted program copies them all: one compile, where a
    `jnp.copy` per array compiled one program per distinct shape (tiny Llama: 8, 0.06-0.07 s against
    0.016-0.026 s cold)."""
    graphdef, state = nnx.split(module)
    leaves, treedef = jax.tree.flatten(state)
    where = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
    if where:  # none when shape-only (mode=compile): nothing to run, on a backend that may not run
        for i, copy in zip(where, _copies([leaves[i] for i in where]), strict=True):
            leaves[i] = copy
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))


@jax.jit
def _copies(arrays: list[jax.Array]) -> list[jax.Array]:
    return [jnp.copy(x) for x in arrays]
