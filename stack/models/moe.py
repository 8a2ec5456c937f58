"""Top-k routed experts in place of a decoder layer's MLP (Qwen3-MoE, Mixtral), as transformers
computes them: router logits = x W_r, probabilities = softmax in float32, the top k of them (Mixtral
and Qwen3-MoE with norm_topk_prob: renormalised to sum to 1), each token's output the weighted sum
of its k experts' SwiGLU MLPs.

Dropless, no capacity: every token reaches its k experts. The (token, expert) pairs are sorted by
expert and each expert's rows multiplied by its weights in one grouped matmul (`jax.lax.ragged_dot`,
XLA's grouped matmul), never a dense loop over experts. Params: `router` [D, E], `gate_proj` /
`up_proj` [E, D, F], `down_proj` [E, F, D] with the logical axes ("expert", ...).

Load balancing (Switch Transformer; transformers' `load_balancing_loss_func`): with `record` on (the
train step sets it on the policy), each layer sows its counts of top-k assignments per expert, its
router probabilities summed per expert, and its real tokens; `router_aux_loss` turns the sums of
every layer into E · Σ_e f_e · P_e (f: the fraction of assignments, P: the mean probability).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from stack.models.shape import LlamaShape

Array = jax.Array


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

    def route(self, x: Array) -> tuple[Array, Array, Array]:
        """(probabilities [N, E] float32, the top-k weights [N, k] and experts [N, k]) of tokens x [N, D]."""
        probs = jax.nn.softmax(self.router(x).astype(jnp.float32), axis=-1)
        weights, chosen = jax.lax.top_k(probs, self.top_k)
        if self.normalize:
            weights = weights / weights.sum(-1, keepdims=True)
        return probs, weights.astype(x.dtype), chosen

    def __call__(self, x: Array, real: Array | None = None) -> Array:
        b, t, d = x.shape
        tokens = x.reshape(b * t, d).astype(self.dtype)
        probs, weights, chosen = self.route(tokens)
        order = jnp.argsort(chosen.reshape(-1), stable=True)  # (token, expert) pairs by expert
        rows = tokens[order // self.top_k]
        sizes = jnp.bincount(chosen.reshape(-1), length=self.experts).astype(jnp.int32)
        kernels = [p[...].astype(self.dtype) for p in (self.gate_proj, self.up_proj, self.down_proj)]
        h = jax.nn.silu(jax.lax.ragged_dot(rows, kernels[0], sizes)) * jax.lax.ragged_dot(rows, kernels[1], sizes)
        out = jax.lax.ragged_dot(h, kernels[2], sizes) * weights.reshape(-1)[order][:, None]
        y = jnp.zeros_like(tokens).at[order // self.top_k].add(out)
        if self.record:
            self._sow(probs, chosen, jnp.ones((b * t,), bool) if real is None else real.reshape(-1))
        return y.reshape(b, t, d)

    def _sow(self, probs: Array, chosen: Array, real: Array) -> None:
        weight = real.astype(jnp.float32)
        counts = jnp.zeros((self.experts,), jnp.float32).at[chosen.reshape(-1)].add(
            jnp.repeat(weight, self.top_k))
        prob_sums = (probs * weight[:, None]).sum(0)
        self.sow(RouterStats, "stats", jnp.stack([counts, prob_sums, jnp.broadcast_to(weight.sum(), counts.shape)]))


def record_router(model: nnx.Module, on: bool = True) -> nnx.Module:
    """`model` with its MoE layers sowing RouterStats (or not)."""
    for module in (m for _, m in nnx.iter_modules(model) if isinstance(m, MoE)):
        module.record = on
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
