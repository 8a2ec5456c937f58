"""The `quantization` group: Qwix LoRA / QLoRA applied to a built model.

`method=lora` wraps the matched projections with `qwix.LoraProvider`: each gets float
adapters A (he-uniform) and B (zeros) as `nnx.LoRAParam`s, so the step-0 model equals the
base model. With a rule's `weight_qtype` (nf4, int8, int4) the frozen base weight is stored
quantized (QLoRA). Only `trainable(q)` params get gradients and optimizer state; the base
weights are rebuilt from `seed` / `model.init_from` on every start and never checkpointed.
"""

from typing import Any

import jax
import jax.numpy as jnp
import qwix
from flax import nnx

from stack.errors import ConfigError


def trainable(q: Any) -> Any:
    """The nnx filter of the params that train: all of them, or only LoRA adapters."""
    return nnx.LoRAParam if q.method == "lora" else nnx.Param


def _provider(q: Any) -> qwix.LoraProvider:
    return qwix.LoraProvider([
        qwix.LoraRule(module_path=r.module_path, rank=r.rank, alpha=r.alpha, weight_qtype=r.weight_qtype,
                      tile_size=r.tile_size)
        for r in q.rules
    ])


def apply_quantization(q: Any, model: nnx.Module, seed: int, abstract: bool = False) -> nnx.Module:
    """`model` with the group's Qwix rules applied (the model itself for method=none).

    Qwix runs one forward on a small example to find the matched layers; `abstract` does
    that shape-only (for a model whose leaves are ShapeDtypeStructs).
    """
    if q.method == "none":
        return model
    provider = _provider(q)

    def apply(m: nnx.Module, example: jax.Array) -> nnx.Module:
        return qwix.apply_lora_to_model(m, provider, example, rngs=nnx.Rngs(seed))

    try:
        if abstract:  # no concrete array: the mesh may be a compile-only TPU topology
            out = nnx.eval_shape(apply, model, jax.ShapeDtypeStruct((1, 8), jnp.int32))
        else:
            out = apply(model, jnp.zeros((1, 8), jnp.int32))
    except ValueError as exc:
        if "cannot be tiled" not in str(exc):
            raise
        tiles = [r.tile_size for r in q.rules]
        raise ConfigError(
            f"'quantization.rules.*.tile_size'={tiles} does not divide the contraction dim of a matched "
            f"weight ({exc}). Pick a tile size that divides model.d_model, n_heads * head_dim and d_ff."
        ) from exc
    unused = provider.get_unused_rules()
    if unused:
        raise ConfigError(
            f"'quantization.rules' module_path {[r.module_path for r in unused]} matches no layer of "
            "the model; paths look like layers/0/attn/q_proj, "
            "layers/0/mlp/down_proj, lm_head (a regex fullmatch)."
        )
    return out
