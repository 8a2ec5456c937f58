"""Top-k routed experts in place of a decoder layer's MLP (Qwen3-MoE, Mixtral), as transformers
computes them: router logits = x W_r, probabilities = softmax in float32, the top k of them (Mixtral
and Qwen3-MoE with norm_topk_prob: renormalised to sum to 1), each token's output the weighted sum
of its k experts' SwiGLU MLPs.

Dropless, no capacity: every token reaches its k experts. The (token, expert) pairs are sorted by
expert and each expert's rows multiplied by its weights in one grouped matmul, never a dense loop
over experts: `jax.lax.ragged_dot` (XLA's; CPU, GPU), or on TPU the Pallas megablox kernel (`gmm`,
its weight gradient `tgmm`: libtpu's ragged dot computes the weight gradient densely, E times the
work), set by `use_experts`; `interpret`: Pallas interpret mode, for tests on CPU. Params: `router`
[D, E], `gate_proj` / `up_proj` [E, D, F], `down_proj` [E, F, D] with the logical axes ("expert", ...).

Load balancing (Switch Transformer; transformers' `load_balancing_loss_func`): with `record` on (the
train step sets it on the policy), each layer sows its counts of top-k assignments per expert, its
router probabilities summed per expert, and its real tokens; `router_aux_loss` turns the sums of
every layer into E · Σ_e f_e · P_e (f: the fraction of assignments, P: the mean probability).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core.spmd import get_logical_axis_rules
from jax.sharding import PartitionSpec

from stack.models.shape import LlamaShape

Array = jax.Array


TILE = 128  # megablox's row / column tiles
GROUPED = ("ragged", "megablox")


class RouterStats(nnx.Intermediate):
    """One forward's routing counts of a layer: [3, E] (assignments, probability sums, real tokens)."""


def _experts(shape: tuple[int, ...], names: tuple, cfg: LlamaShape, rngs: nnx.Rngs) -> nnx.Param:
    init = nnx.with_partitioning(nnx.initializers.normal(cfg.init_std), names)
    return nnx.Param(init(rngs.params(), shape, jnp.dtype(cfg.param_dtype)))


class MoE(nnx.Module):
    """Routed SwiGLU experts: x [B, T, D] (and `real` [B, T]: the tokens the balance counts) -> [B, T, D]."""

    def __init__(self, cfg: LlamaShape, experts: int, top_k: int, d_ff: int, normalize: bool, *, rngs: nnx.Rngs):
        d = cfg.d_model
        init = nnx.with_partitioning(nnx.initializers.normal(cfg.init_std), ("embed", None))
        self.router = nnx.Linear(d, experts, use_bias=False, kernel_init=init, dtype=jnp.dtype(cfg.dtype),
                                 param_dtype=jnp.dtype(cfg.param_dtype), rngs=rngs)
        self.gate_proj = _experts((experts, d, d_ff), ("expert", "embed", "mlp"), cfg, rngs)
        self.up_proj = _experts((experts, d, d_ff), ("expert", "embed", "mlp"), cfg, rngs)
        self.down_proj = _experts((experts, d_ff, d), ("expert", "mlp", "embed"), cfg, rngs)
        self.experts, self.top_k, self.normalize, self.dtype = experts, top_k, normalize, jnp.dtype(cfg.dtype)
        self.record = False  # sow RouterStats (the train step's policy)
        self.kernel, self.interpret = "ragged", False  # set by use_experts

    def __call__(self, x: Array, real: Array | None = None) -> Array:
        real = jnp.ones(x.shape[:2], bool) if real is None else real
        weights = (self.router.kernel[...], self.gate_proj[...], self.up_proj[...], self.down_proj[...])
        fn = partial(_routed, self.top_k, self.normalize, self.dtype, partial(_grouped, self.kernel, self.interpret))
        y, stats = _sharded(fn, self.kernel == "megablox")(x, real, *weights)
        if self.record:
            self.sow(RouterStats, "stats", stats)
        return y


def _routed(top_k: int, normalize: bool, dtype: Any, grouped: Any, x: Array, real: Array, router: Array,
            gate: Array, up: Array, down: Array, first: Array | int = 0) -> tuple[Array, Array]:
    """x [B, T, D] through the routed experts -> (y [B, T, D], RouterStats [3, E] of the `real` tokens).
    With a shard of the experts (`gate` [E_local, ...], experts first .. first + E_local - 1 of the
    router's E): y sums those experts' outputs only."""
    b, t, d = x.shape
    tokens = x.reshape(b * t, d).astype(dtype)
    probs = jax.nn.softmax((tokens @ router.astype(dtype)).astype(jnp.float32), axis=-1)
    weights, chosen = jax.lax.top_k(probs, top_k)
    if normalize:
        weights = weights / weights.sum(-1, keepdims=True)
    order = jnp.argsort(chosen.reshape(-1), stable=True)  # (token, expert) pairs by expert
    sizes = jnp.bincount(chosen.reshape(-1), length=router.shape[1]).astype(jnp.int32)
    out = _local_experts(grouped, tokens[order // top_k], sizes, first, *(w.astype(dtype) for w in (gate, up, down)))
    out = out * weights.astype(dtype).reshape(-1)[order][:, None]
    y = jnp.zeros_like(tokens).at[order // top_k].add(out)
    weight = real.reshape(-1).astype(jnp.float32)
    counts = jnp.zeros((router.shape[1],), jnp.float32).at[chosen.reshape(-1)].add(jnp.repeat(weight, top_k))
    stats = jnp.stack([counts, (probs * weight[:, None]).sum(0), jnp.broadcast_to(weight.sum(), counts.shape)])
    return y.reshape(b, t, d), stats


def _local_experts(grouped: Any, rows: Array, sizes: Array, first: Array | int, gate: Array, up: Array,
                   down: Array) -> Array:
    """The SwiGLU experts of `rows` [M, D] sorted by expert (`sizes` [E] per expert), by the experts
    first .. first + E_local - 1 that `gate` / `up` / `down` hold; the other rows' outputs are 0."""
    local = gate.shape[0]
    if local == sizes.shape[0]:
        return grouped(jax.nn.silu(grouped(rows, gate, sizes)) * grouped(rows, up, sizes), down, sizes)
    start = jnp.cumsum(sizes)[first] - sizes[first]  # the local experts' rows begin here
    mine = jax.lax.dynamic_slice_in_dim(sizes, first, local)
    # rows past the local groups are not computed (megablox leaves them unwritten, in both directions):
    # a select before each product and after the last keeps them out of the values and the gradients
    held = (jnp.arange(rows.shape[0]) < mine.sum())[:, None]
    rows = jnp.where(held, jnp.roll(rows, -start, axis=0), 0)
    h = jnp.where(held, jax.nn.silu(grouped(rows, gate, mine)) * grouped(rows, up, mine), 0)
    return jnp.roll(jnp.where(held, grouped(h, down, mine), 0), start, axis=0)


def _grouped(kernel: str, interpret: bool, rows: Array, w: Array, sizes: Array) -> Array:
    """rows [M, K] (by group, `sizes` [E] of them) times their group's w [E, K, N] -> [M, N]."""
    if kernel == "ragged":
        return jax.lax.ragged_dot(rows, w, sizes)
    # Pallas's TPU kernels (~0.15 s to import): off every run that does not use them
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    m = rows.shape[0]
    pad = -m % TILE  # megablox takes rows in tiles: zero rows of the last group, dropped after
    tiling = (TILE, min(TILE, w.shape[1]), min(TILE, w.shape[2]))
    return gmm(jnp.pad(rows, ((0, pad), (0, 0))), w, sizes.at[-1].add(pad), rows.dtype, tiling,
               interpret=interpret)[:m]


def _sharded(fn: Any, kernel: bool) -> Any:
    """`fn` (x, real, router, gate, up, down) under the mesh. Without an expert axis and a Pallas
    `kernel`, per shard of the batch (XLA does not partition a Pallas kernel): each device routes its
    own tokens through the whole experts (their shards gathered, as FSDP gathers a dense layer's).

    Expert parallelism (the logical `expert` axis on a mesh axis of size > 1): each device holds
    E / ep experts. Its tokens are gathered over the expert axis (when the batch is split over it),
    every device routes them all and computes its own experts' share, and the shares are summed
    back to each device's tokens (a reduce-scatter; Megatron-Core's all-gather token dispatcher).
    The routing counts are summed over the batch's other axes. Neither: `fn` as XLA partitions it."""
    mesh = jax.sharding.get_abstract_mesh()
    rules = dict(get_logical_axis_rules())
    rows, ep = rules.get("batch"), rules.get("expert")
    ep = ep if isinstance(ep, str) and not mesh.empty and mesh.shape.get(ep, 1) > 1 else None
    if mesh.empty or not (kernel or ep):
        return fn
    axes = () if rows is None else (rows,) if isinstance(rows, str) else tuple(rows)
    split = ep in axes

    def shard(x: Array, real: Array, router: Array, *experts: Array) -> tuple[Array, Array]:
        if split:
            x, real = (jax.lax.all_gather(a, ep, axis=0, tiled=True) for a in (x, real))
        first = jax.lax.axis_index(ep) * experts[0].shape[0] if ep else 0
        y, stats = fn(x, real, router, *experts, first)
        if ep:
            y = jax.lax.psum_scatter(y, ep, scatter_dimension=0, tiled=True) if split else jax.lax.psum(y, ep)
        others = tuple(a for a in axes if a != ep)
        return y, jax.lax.psum(stats, others) if others else stats

    experts = PartitionSpec(ep)
    specs = (PartitionSpec(rows), PartitionSpec(rows), PartitionSpec(), experts, experts, experts)
    return jax.shard_map(shard, mesh=mesh, in_specs=specs, out_specs=(PartitionSpec(rows), PartitionSpec()),
                         check_vma=False)


def use_experts(model: nnx.Module, kernel: str, interpret: bool = False) -> nnx.Module:
    """`model` with its MoE layers' grouped matmuls by `kernel` (GROUPED)."""
    if kernel not in GROUPED:
        raise ValueError(f"grouped matmul {kernel!r}: one of {', '.join(GROUPED)}")
    for module in (m for _, m in nnx.iter_modules(model) if isinstance(m, MoE)):
        module.kernel, module.interpret = kernel, interpret
    return model


def record_router(model: nnx.Module) -> nnx.Module:
    """`model` with its MoE layers sowing RouterStats."""
    for module in (m for _, m in nnx.iter_modules(model) if isinstance(m, MoE)):
        module.record = True
    return model


def router_aux_loss(model: nnx.Module) -> Array | None:
    """The load-balancing loss of everything `model`'s MoE layers sowed since it was built (popped):
    E · Σ_e (assignments_e / tokens) · (probability sum_e / tokens), over every layer and call, as
    transformers' load_balancing_loss_func over the concatenated layers; None without MoE layers."""
    sown = jax.tree.leaves(nnx.pop(model, RouterStats))
    if not sown:
        return None
    counts, probs, tokens = sum(s.reshape(-1, *s.shape[-2:]).sum(0) for s in sown)
    total = jnp.maximum(tokens[0], 1.0)
    return counts.shape[0] * jnp.sum((counts / total) * (probs / total))


def moe_layers(model: Any) -> bool:
    """Whether `model` routes tokens to experts."""
    return any(isinstance(m, MoE) for _, m in nnx.iter_modules(model))
