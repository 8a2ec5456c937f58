"""The `quantization` group as one provider object the rest of the code asks.

A provider says how to apply its Qwix rules to a built model (`apply`), which of the
policy's variables train (`trainable`, an nnx filter), and how to get the base model back
(`base`: the model with its adapters off, or None when there are no adapters). Nothing
outside this module tests the method's name.

`method=lora` wraps the matched projections with `qwix.LoraProvider`: each gets float
adapters A (he-uniform) and B (zeros) as `nnx.LoRAParam`s, so the step-0 model equals the
base model. With a rule's `weight_qtype` (nf4, int8, int4) the frozen base weight is stored
quantized (QLoRA). Only the adapters get gradients and optimizer state; the base weights are
rebuilt from `seed` / `model.init_from` on every start and never checkpointed.
"""

from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import qwix
from flax import nnx

from stack.errors import ConfigError


def adapters_off(model: nnx.Module) -> nnx.Module:
    """`model` with every LoRA adapter zeroed: the base model (pure; usable inside jit)."""
    graphdef, adapters, rest = nnx.split(model, nnx.LoRAParam, ...)
    return nnx.merge(graphdef, jax.tree.map(jnp.zeros_like, adapters), rest)


@dataclass(frozen=True)
class NoQuantization:
    """Full precision: the model as built, every param trains."""

    trainable: Any = nnx.Param
    base: Callable[[nnx.Module], nnx.Module] | None = None

    def apply(self, model: nnx.Module, abstract: bool = False) -> nnx.Module:
        return model


@dataclass(frozen=True)
class Lora:
    """Qwix LoRA / QLoRA on the modules the rules match; only the adapters train."""

    rules: tuple[Any, ...]
    seed: int
    trainable: Any = nnx.LoRAParam
    base: Callable[[nnx.Module], nnx.Module] | None = adapters_off

    def _provider(self) -> qwix.LoraProvider:
        return qwix.LoraProvider([
            qwix.LoraRule(module_path=r.module_path, rank=r.rank, alpha=r.alpha, weight_qtype=r.weight_qtype,
                          tile_size=r.tile_size)
            for r in self.rules
        ])

    def apply(self, model: nnx.Module, abstract: bool = False) -> nnx.Module:
        """`model` with the adapters added. Qwix runs one forward on a small example to find
        the matched layers; `abstract` does that shape-only (leaves are ShapeDtypeStructs)."""
        provider = self._provider()

        def apply(m: nnx.Module, example: jax.Array) -> nnx.Module:
            return qwix.apply_lora_to_model(m, provider, example, rngs=nnx.Rngs(self.seed))

        try:
            if abstract:  # no concrete array: the mesh may be a compile-only TPU topology
                out = nnx.eval_shape(apply, model, jax.ShapeDtypeStruct((1, 8), jnp.int32))
            else:
                out = apply(model, jnp.zeros((1, 8), jnp.int32))
        except ValueError as exc:
            if "cannot be tiled" not in str(exc):
                raise
            raise ConfigError(
                f"'quantization.rules.*.tile_size'={[r.tile_size for r in self.rules]} does not divide the "
                f"contraction dim of a matched weight ({exc}). Pick a tile size that divides model.d_model, "
                "n_heads * head_dim and d_ff.") from exc
        unused = provider.get_unused_rules()
        if unused:
            raise ConfigError(
                f"'quantization.rules' module_path {[r.module_path for r in unused]} matches no layer of the "
                "model; paths look like layers/0/attn/q_proj, layers/0/mlp/down_proj, lm_head (a regex fullmatch).")
        return out


def make_quantization(q: Any, seed: int) -> NoQuantization | Lora:
    """The provider of the `quantization` group's config `q`."""
    return Lora(tuple(q.rules), seed) if q.method == "lora" else NoQuantization()
