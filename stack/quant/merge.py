"""Folding LoRA adapters into their base weights, for export (`stack.tools.hf export --merge-adapters`),
and a PTQ model's weights back to float.

Qwix LoRA keeps, on each adapted `nnx.Linear`, the frozen `kernel` [in, out] (a QLoRA base: a
quantized `WithAux` array) and `kernel_lora_a` [in, r], `kernel_lora_b` [r, out]; its forward
is x W + (alpha / rank) x A B. The merged weight is therefore W + (alpha / rank) A B, with a
QLoRA base dequantized first (float32).
"""

import re
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import qwix
from flax import nnx


def _rule_of(path: str, rules: Sequence[Any]) -> Any:
    """The rule Qwix applied to `path`: the first whose regex fullmatches it."""
    return next(r for r in rules if re.fullmatch(r.module_path, path))


def _dense(weight: Any) -> jnp.ndarray:
    """A float32 kernel from a plain (an `nnx.Param`) or a QLoRA one (a `WithAux(QArray)`)."""
    if isinstance(weight, nnx.Variable):
        weight = weight.get_value()
    return (qwix.dequantize(weight.array) if hasattr(weight, "array") else weight).astype(jnp.float32)


def plain_params(model: nnx.Module) -> dict[str, Any]:
    """The model's params as a nested dict with string keys (a checkpoint's layout)."""
    def strings(node: Any) -> Any:
        return {str(k): strings(v) for k, v in node.items()} if isinstance(node, dict) else node

    return strings(nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def merge_adapters(model: nnx.Module, rules: Sequence[Any]) -> dict[str, Any]:
    """The params of the plain model (a nested dict like `nnx.to_pure_dict`) with every adapted
    kernel replaced by W + (alpha / rank) A B and the adapters dropped."""
    params = plain_params(model)
    for path, module in nnx.iter_modules(model):
        if not hasattr(module, "kernel_lora_a"):
            continue
        rule = _rule_of("/".join(map(str, path)), rules)
        a, b = module.kernel_lora_a.get_value(), module.kernel_lora_b.get_value()
        node = params
        for key in path:
            node = node[str(key)]
        node["kernel"] = _dense(module.kernel) + (rule.alpha / rule.rank) * (a @ b)
        del node["kernel_lora_a"], node["kernel_lora_b"]
    return params


def dequantized_params(model: nnx.Module) -> dict[str, Any]:
    """The params of a PTQ model as float32 kernels (the plain model's layout; activation scales dropped)."""
    params = plain_params(model)
    for path, module in nnx.iter_modules(model):
        node = params
        for key in path:
            node = node[str(key)]
        for name in [k for k in node if k.endswith("_scale")]:
            del node[name]
        if hasattr(getattr(module, "kernel", None), "array"):
            node["kernel"] = _dense(module.kernel)
    return params
