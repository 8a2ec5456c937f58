"""The `quantization` group's rules against a model: checked before any compute, and turned
into Qwix rules.

A rule's `module_path` is a regex fullmatched against the model's module paths (Qwix's
convention: `layers/0/attn/q_proj`, `layers/1/mlp/down_proj`, `lm_head`, `embed`); Qwix applies
the first rule that matches an op's module.
"""

import re
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import qwix
from flax import nnx

from stack.errors import ConfigError

# a rule's qtype name -> what Qwix takes
QWIX_QTYPES = {"int8": jnp.int8, "int4": jnp.int4, "fp8": jnp.float8_e4m3fn, "nf4": "nf4"}


def qtype(name: str | None) -> Any:
    """Qwix's qtype of a rule's qtype name (None stays None)."""
    return None if name is None else QWIX_QTYPES[name]


STATIC = dict(act_static_scale=True, act_batch_axes=(0, 1))  # one scale over batch and token axes


def qwix_rules(rules: Sequence[Any], rule_type: type = qwix.QuantizationRule) -> list[Any]:
    """Qwix rules (PTQ's `QuantizationRule` or calibration's `QtRule`), activations static."""
    return [rule_type(module_path=r.module_path, weight_qtype=qtype(r.weight_qtype), tile_size=r.tile_size,
                      weight_calibration_method=r.weight_calibration,
                      **(dict(act_qtype=qtype(r.act_qtype), act_calibration_method=r.act_calibration, **STATIC)
                         if r.act_qtype else {}))
            for r in rules]


def module_paths(model: nnx.Module) -> dict[str, int | None]:
    """Each module that owns a matmul weight -> its contraction dim (None for an embedding)."""
    found: dict[str, int | None] = {}
    for path, module in nnx.iter_modules(model):
        name = "/".join(map(str, path))
        if isinstance(module, nnx.Linear):
            found[name] = module.kernel.shape[0]
        elif isinstance(module, nnx.Embed):
            found[name] = None
    return found


def check_against_model(rules: Sequence[Any], model: nnx.Module) -> None:
    """Every rule matches a module, and its tile size divides each matched layer's contraction dim."""
    paths = module_paths(model)
    for i, r in enumerate(rules):
        matched = [p for p in paths if re.fullmatch(r.module_path, p)]
        if not matched:
            listing = ", ".join(sorted(paths, key=_natural))
            raise ConfigError(f"'quantization.rules.{i}.module_path'={r.module_path!r} matches no module of the "
                              f"model (a regex fullmatch). The model's modules: {listing}.")
        for p in matched:
            dim = paths[p]
            if r.tile_size and dim is not None and dim % r.tile_size:
                raise ConfigError(f"'quantization.rules.{i}.tile_size'={r.tile_size} does not divide layer {p}'s "
                                  f"contraction dim {dim}; pick a divisor of {dim} (or narrow module_path).")


def _natural(path: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]
