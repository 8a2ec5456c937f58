"""Hugging Face tensor names of the decoder's params, per family (stack.models.family).

Gemma 3 names its norms input / post_attention / pre_feedforward / post_feedforward_layernorm; the
others input and post_attention (the norm before the MLP). Routed experts (stack.models.moe) are
one stacked param per projection here and one tensor per expert there: Qwen3-MoE's
`mlp.experts.<e>.{gate,up,down}_proj`, Mixtral's `block_sparse_moe.experts.<e>.{w1,w3,w2}`, the
router `mlp.gate` / `block_sparse_moe.gate`. torch's `Linear.weight` is [out, in]: our kernels
and expert slices are its transpose.
"""

from __future__ import annotations

from typing import NamedTuple

from flax import nnx

NORMS = {"attn_norm": "input", "mlp_norm": "post_attention"}
GEMMA_NORMS = {"attn_norm": "input", "post_attn_norm": "post_attention", "mlp_norm": "pre_feedforward",
               "post_mlp_norm": "post_feedforward"}
MIXTRAL_EXPERTS = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


class Slot(NamedTuple):
    """Where a HF tensor goes: a Param, whether the tensor is its transpose, and an expert's index
    in a stacked param (None: the whole param)."""

    var: nnx.Variable
    transpose: bool
    index: int | None = None


def hf_name(path: tuple, gemma: bool = False, mixtral: bool = False) -> str:
    """HF tensor name of the param at NNX state `path` (e.g. ('layers', 0, 'attn', 'q_proj', 'kernel'))."""
    if path[0] != "layers":
        return {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight",
                "lm_head": "lm_head.weight"}[path[0]]
    i, part = path[1], path[2]
    norms = GEMMA_NORMS if gemma else NORMS
    if part in norms:
        return f"model.layers.{i}.{norms[part]}_layernorm.weight"
    leaf = "bias" if path[-1] == "bias" else "weight"
    block = "self_attn" if part == "attn" else "block_sparse_moe" if mixtral else "mlp"
    return f"model.layers.{i}.{block}.{'gate' if path[3] == 'router' else path[3]}.{leaf}"


def hf_params(model: nnx.Module) -> dict[str, Slot]:
    """HF name -> Slot of every param of `model` (a decoder)."""
    variant = getattr(model, "variant", None)
    gemma, mixtral = getattr(variant, "gemma", False), getattr(variant, "family", None) == "mixtral"
    out = {}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if len(path) == 4 and path[2] == "mlp":  # a MoE layer's stacked experts [E, ...]
            i, name = path[1], path[3]
            for e in range(var.get_value().shape[0]):
                expert = (f"model.layers.{i}.block_sparse_moe.experts.{e}.{MIXTRAL_EXPERTS[name]}.weight" if mixtral
                          else f"model.layers.{i}.mlp.experts.{e}.{name}.weight")
                out[expert] = Slot(var, True, e)
        else:
            out[hf_name(path, gemma, mixtral)] = Slot(var, path[-1] == "kernel")
    return out
