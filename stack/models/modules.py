"""Helpers on whole modules: copy one, ask whether it is shape-only (mode=compile)."""

import jax
from flax import nnx


def is_abstract(module: nnx.Module) -> bool:
    """True when `module`'s leaves are ShapeDtypeStructs (built by `nnx.eval_shape`)."""
    return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(nnx.state(module)))


def copy_module(module: nnx.Module) -> nnx.Module:
    """A copy of `module` with its own arrays, each sharded as its original (other leaves, e.g.
    shape-only ones, stay as they are). `jax.device_put(..., may_alias=False)` copies every buffer
    in the runtime, with no program to compile (a jitted copy's compile is slow beside
    stack.engine.precompile's)."""
    graphdef, state = nnx.split(module)
    leaves, treedef = jax.tree.flatten(state)
    where = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
    if where:  # none when shape-only (mode=compile): nothing to copy, on a backend that may not run
        copies = jax.device_put([leaves[i] for i in where], [leaves[i].sharding for i in where], may_alias=False)
        for i, copy in zip(where, copies, strict=True):
            leaves[i] = copy
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
