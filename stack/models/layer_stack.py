"""The decoder layers run in order, unrolled or as one `jax.lax.scan` (`model.scan_layers`).

Unrolled, XLA compiles n_layers copies of the layer and may schedule every layer's FSDP weight
all-gather early; scanned (as MaxText's `scan_layers`), it compiles one, and a layer's weights are
gathered inside the loop body: less memory per chip and a much shorter compile for large models
(mode=compile of Llama 3 8B and 70B SFT on TPU slices). The params stay one module per layer (HF
paths, checkpoints, LoRA): the scan stacks them inside the traced step (a copy, sharded as they are).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core.spmd import get_logical_axis_rules
from jax.sharding import PartitionSpec

from stack.models.moe import RouterStats

# model.remat: what a rematerialised layer keeps for the backward (None: only its input)
REMAT_POLICIES = {"full": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}

Array = jax.Array


def run_layers(layers: Sequence[nnx.Module], x: Array, args: tuple, remat: str, scan: bool) -> Array:
    """x through every layer, `layer(x, *args)`; `remat` ("none", "full", "dots") wraps each layer
    so that the backward recomputes it; `scan`: one `jax.lax.scan` over the stacked layer params."""
    if scan:
        return _scanned(layers, x, args, remat)
    call: Callable[..., Array] = lambda layer, x: layer(x, *args)  # noqa: E731
    if remat != "none":
        call = nnx.remat(call, policy=REMAT_POLICIES[remat])
    x = _rows_sharded(x)
    for layer in layers:
        x = call(layer, x)
    return x


def _scanned(layers: Sequence[nnx.Module], x: Array, args: tuple, remat: str) -> Array:
    """The scan; what its layers sow (stack.models.moe.RouterStats) comes out stacked over layers and is
    sown on the first layer's MLP, where the train step pops it."""
    graphdef, *states = _split(layers)

    def body(x: Array, state: Any) -> tuple[Array, list]:
        layer = nnx.merge(graphdef, state)
        return _rows_sharded(layer(x, *args)), jax.tree.leaves(nnx.pop(layer, RouterStats))

    if remat != "none":
        body = jax.checkpoint(body, policy=REMAT_POLICIES[remat], prevent_cse=False)
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)
    x, sown = jax.lax.scan(body, _rows_sharded(x), stacked)
    for stats in sown:
        layers[0].mlp.sow(RouterStats, "stats", stats)
    return x


def _rows_sharded(x: Array) -> Array:
    """x [B, T, ...] with its rows over the `batch` rule's mesh axes and its tokens over the `length`
    rule's (mesh=context). Left to XLA's propagation, the scan's carry nearly tripled Llama 3 70B's
    memory per chip."""
    if jax.sharding.get_abstract_mesh().empty:
        return x
    rules = dict(get_logical_axis_rules())
    return jax.lax.with_sharding_constraint(x, PartitionSpec(rules.get("batch"), rules.get("length")))


def _split(layers: Sequence[nnx.Module]) -> tuple:
    """(graphdef, state of layer 0, state of layer 1, ...); every layer must share the graphdef."""
    splits = [nnx.split(layer) for layer in layers]
    graphdef = splits[0][0]
    if any(g != graphdef for g, _ in splits[1:]):
        raise ValueError("model.scan_layers=true needs decoder layers of one structure; these differ")
    return (graphdef, *(state for _, state in splits))
