"""The provider object of the `quantization` group: what the rest of the code asks.

Every provider has:
- `apply(model, abstract)`: the model with the rules applied (rules checked first, stack.quant.rules);
- `trainable`: an nnx filter of the policy's variables that train, which is what a checkpoint
  saves of the policy (LoRA: the adapters only; `stack.config.quantization.has_adapters` says so from
  the config alone);
- `base`: the model with adapters off (the reference of a LoRA run), or None;
- `unquantized`: the float view of a fake-quantized model (QAT's float eval), or None;
- `finalize(model)`: the params of the plain float model to export (a nested dict: adapters
  merged, fake quantization off).

`qat`: Qwix QT (`QtProvider`) fakes the rule's weight/activation quantization in the forward
pass (straight-through gradients); the params stay float and train as usual.
`lora`: Qwix `LoraProvider` adds float adapters A (he-uniform) and B (zeros) as `nnx.LoRAParam`
to the matched projections (step 0 equals the base model); a rule's `weight_qtype` stores the
frozen base quantized (QLoRA). Only the adapters train; the base is rebuilt from `seed` /
`model.init_from` on every start and never checkpointed.
`ptq`: not a training provider (validation refuses it for training; `python -m stack.tools.quantize`
makes a PTQ checkpoint, stack.quant.ptq). `apply` gives the structure such a checkpoint is read
into (Qwix `PtqProvider`: quantized weights, static activation scales); `finalize` dequantizes.
"""

from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import qwix
from flax import nnx

from stack.models.llama import unfuse
from stack.quant.merge import dequantized_params, merge_adapters, plain_params
from stack.quant.rules import check_against_model, qtype, qwix_rules

EXAMPLE = (1, 8)  # the token batch Qwix runs once to find the matched layers


def adapters_off(model: nnx.Module) -> nnx.Module:
    """`model` with every LoRA adapter zeroed: the base model (pure; usable inside jit)."""
    graphdef, adapters, rest = nnx.split(model, nnx.LoRAParam, ...)
    return nnx.merge(graphdef, jax.tree.map(jnp.zeros_like, adapters), rest)


def unquantized(model: nnx.Module) -> nnx.Module:
    """The same params under the model's own (unintercepted) class: the float forward."""
    plain = nnx.clone(model)
    plain.__class__ = type(model)._unquantized_type
    return plain


def run_once(quantize: Callable[[nnx.Module, jax.Array], nnx.Module], model: nnx.Module,
             abstract: bool) -> nnx.Module:
    """`quantize(model, example tokens)` in one jitted program (eager, Qwix's forward would
    compile every op on its own, several times slower; the same values and shardings); `abstract`:
    shape-only (no concrete array is created, the mesh may be a compile-only TPU topology)."""
    model = unfuse(model)  # Qwix intercepts each projection's own call
    if abstract:
        return nnx.eval_shape(quantize, model, jax.ShapeDtypeStruct(EXAMPLE, jnp.int32))
    return nnx.jit(quantize)(model, jnp.zeros(EXAMPLE, jnp.int32))


@dataclass(frozen=True)
class NoQuantization:
    """Full precision: the model as built, every param trains."""

    trainable: Any = nnx.Param
    base: Callable[[nnx.Module], nnx.Module] | None = None
    unquantized: Callable[[nnx.Module], nnx.Module] | None = None

    def apply(self, model: nnx.Module, abstract: bool = False) -> nnx.Module:
        return model

    def finalize(self, model: nnx.Module) -> dict[str, Any]:
        return plain_params(model)


@dataclass(frozen=True)
class Qat:
    """Quantization-aware training (Qwix QT): fake-quantized forward, float params train."""

    rules: tuple[Any, ...]
    trainable: Any = nnx.Param
    base: Callable[[nnx.Module], nnx.Module] | None = None
    unquantized: Callable[[nnx.Module], nnx.Module] | None = unquantized

    def apply(self, model: nnx.Module, abstract: bool = False) -> nnx.Module:
        check_against_model(self.rules, model)
        provider = qwix.QtProvider([
            qwix.QtRule(module_path=r.module_path, weight_qtype=qtype(r.weight_qtype), act_qtype=qtype(r.act_qtype),
                        tile_size=r.tile_size, weight_calibration_method=r.weight_calibration,
                        act_calibration_method=r.act_calibration)
            for r in self.rules])
        # QT creates no variables (dynamic activation scales): no forward needed to set it up
        return run_once(lambda m, x: qwix.quantize_model(m, provider, x, skip_nnx_init=True), model, abstract)

    def finalize(self, model: nnx.Module) -> dict[str, Any]:
        return plain_params(model)  # QT's params are the float weights


@dataclass(frozen=True)
class Lora:
    """Qwix LoRA / QLoRA on the modules the rules match; only the adapters train."""

    rules: tuple[Any, ...]
    seed: int
    trainable: Any = nnx.LoRAParam
    base: Callable[[nnx.Module], nnx.Module] | None = adapters_off
    unquantized: Callable[[nnx.Module], nnx.Module] | None = None

    def apply(self, model: nnx.Module, abstract: bool = False) -> nnx.Module:
        """`model` with the adapters added (Qwix runs one forward on a small example)."""
        check_against_model(self.rules, model)
        provider = qwix.LoraProvider([
            qwix.LoraRule(module_path=r.module_path, rank=r.rank, alpha=r.alpha, weight_qtype=qtype(r.weight_qtype),
                          tile_size=r.tile_size, weight_calibration_method=r.weight_calibration)
            for r in self.rules])
        return run_once(lambda m, x: qwix.apply_lora_to_model(m, provider, x, rngs=nnx.Rngs(self.seed)),
                        model, abstract)

    def finalize(self, model: nnx.Module) -> dict[str, Any]:
        return merge_adapters(model, self.rules)


@dataclass(frozen=True)
class Ptq:
    """Post-training quantization (Qwix PTQ): quantized weights and static activation scales."""

    rules: tuple[Any, ...]
    trainable: Any = nnx.Param
    base: Callable[[nnx.Module], nnx.Module] | None = None
    unquantized: Callable[[nnx.Module], nnx.Module] | None = None

    def apply(self, model: nnx.Module, abstract: bool = False) -> nnx.Module:
        """The PTQ structure of `model` (its scales are placeholders until a checkpoint is read in)."""
        check_against_model(self.rules, model)
        provider = qwix.PtqProvider(qwix_rules(self.rules))
        return run_once(lambda m, x: qwix.quantize_model(m, provider, x), model, abstract)

    def finalize(self, model: nnx.Module) -> dict[str, Any]:
        return dequantized_params(model)


def make_quantization(q: Any, seed: int) -> NoQuantization | Qat | Lora | Ptq:
    """The provider of the `quantization` group's config `q`."""
    providers = {"none": lambda: NoQuantization(), "qat": lambda: Qat(tuple(q.rules)),
                 "lora": lambda: Lora(tuple(q.rules), seed), "ptq": lambda: Ptq(tuple(q.rules))}
    return providers[q.method]()
