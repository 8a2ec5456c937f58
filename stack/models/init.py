"""Building a Llama: `init_model` (initialised, sharded at creation under a mesh) and
`abstract_model` (shapes only). In flax 0.12 eager sharding is on by default, so `Llama(cfg,
rngs=...)` and even `nnx.eval_shape(lambda: Llama(...))` raise "An auto mesh context ... is
required" unless a mesh is active: both shard eagerly under a mesh (`jax.set_mesh` +
`nnx.logical_axis_rules`), else build under `nnx.use_eager_sharding(False)`; the metadata is kept
either way.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import numpy as np
from flax import nnx

from stack.hardware.cpu_compiler import CPU_LEVEL, LEVEL_FLAG
from stack.models.blocks import Block
from stack.models.family import variant_of
from stack.models.llama import Llama, head_dim_of
from stack.models.shape import LlamaShape


def _eager_sharding() -> nnx.use_eager_sharding:
    """Shard parameters at creation only when a mesh is active (flax 0.12 otherwise raises)."""
    return nnx.use_eager_sharding(not jax.sharding.get_abstract_mesh().empty)


def _rngs(seed: int) -> nnx.Rngs:
    """`nnx.Rngs(seed)` with its counters held in array refs, for building inside a trace.

    With plain counters every key draw in a trace costs O(trace length) (flax's
    `Variable.set_value` reads a tracer's `.sharding`, whose error message scans the whole
    jaxpr), so tracing a 70B build takes several times longer.
    """
    with nnx.var_defaults(ref=True):
        return nnx.Rngs(seed)


# XLA:CPU compiles the init at LLVM -O1 (stack.hardware.cpu_compiler's level, here whatever XLA_FLAGS says): the
# bits of the default -O2 (tiny to Llama 3 1B), as fast to run, ~1/3 less compile time (tiny 1.10 ->
# 0.71 s, d_model 512 1.42 -> 1.05 s); -O0 changes last bits.
CPU_INIT_OPTIONS = {LEVEL_FLAG.removeprefix("--"): CPU_LEVEL}


def _skip_layers(cfg: LlamaShape, marks: list) -> Callable[[nnx.Rngs], list]:
    """A `layers` builder for `Llama` that draws no layer: it advances the stream past the keys the
    layers would draw (one block traced for its count; XLA drops its arrays) and records in `marks`
    the count before the layers and the draws per layer."""

    def skip(rngs: nnx.Rngs) -> list:
        before = rngs.default.count[...]
        Block(cfg, head_dim_of(cfg), variant_of(cfg), None, rngs=rngs)  # a layer of either kind draws as many
        per_layer = rngs.default.count[...] - before
        rngs.default.count[...] = before + cfg.n_layers * per_layer
        marks.extend((before, per_layer))
        return []

    return skip


def init_model(cfg: LlamaShape, seed: int) -> Llama:
    """Initialise a Llama from `cfg` with `nnx.Rngs(seed)`: the same random streams as eager
    `Llama(cfg, rngs=nnx.Rngs(seed))` (equal up to float rounding of the fused initializers), the
    bits of the whole build jitted as one program.

    Two jitted programs: the model without its layers, then one layer, run once per layer (its
    place in the stream is an argument; one program per kind of layer, sliding or full), so the
    compile does not grow with depth. XLA:CPU, one
    program for everything: 16 tiny layers compiled in 13 s, Llama 3 1B initialised in 53 s;
    now 0.4 + 1.0 s and 28.5 s. Under a mesh each parameter is created with its sharding, never
    whole on one device.
    """
    graphdefs, marks = {}, []
    options = CPU_INIT_OPTIONS if jax.default_backend() == "cpu" else None

    def without_layers() -> tuple[nnx.State, jax.Array, jax.Array]:
        graphdefs["model"], variables = nnx.split(Llama(cfg, rngs=_rngs(seed), layers=_skip_layers(cfg, marks)))
        return variables, *marks

    variant = variant_of(cfg)

    def one_layer(before: jax.Array, per_layer: jax.Array, i: jax.Array, window: int | None) -> nnx.State:
        rngs = _rngs(seed)
        rngs.default.count[...] = before + i * per_layer
        graphdefs[window], variables = nnx.split(Block(cfg, head_dim_of(cfg), variant, window, rngs=rngs))
        return variables

    with _eager_sharding():
        variables, *stream = jax.jit(without_layers, compiler_options=options)()
        one = jax.jit(one_layer, static_argnums=3, compiler_options=options)
        windows = [variant.window(i) for i in range(cfg.n_layers)]
        layers = [one(*stream, np.uint32(i), w) for i, w in enumerate(windows)]
    model = nnx.merge(graphdefs["model"], variables)
    model.layers = nnx.List([nnx.merge(graphdefs[w], v) for w, v in zip(windows, layers, strict=True)])
    return model


def abstract_model(cfg: LlamaShape) -> Llama:
    """Shape-only Llama (ShapeDtypeStruct leaves, sharding metadata kept); allocates nothing."""
    with _eager_sharding():
        return nnx.eval_shape(lambda: Llama(cfg, rngs=_rngs(0)))


def param_count(cfg: LlamaShape) -> int:
    """Number of parameters of the model described by `cfg`, without allocating them."""
    params = nnx.state(abstract_model(cfg), nnx.Param)
    return sum(math.prod(x.shape) for x in jax.tree.leaves(params))
