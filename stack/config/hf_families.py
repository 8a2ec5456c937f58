"""The decoder families in a Hugging Face `config.json` (transformers 5's keys; stack.models.family):
which `model_type` is which family, the `model` fields each family's keys set, and the keys an
export writes. Without jax (preflight reads it)."""

from __future__ import annotations

from typing import Any

from stack.errors import ConfigError

# config.json model_type -> (model.family, the class prefix of its architectures)
MODEL_TYPES = {"llama": (None, "Llama"), "qwen2": ("qwen2", "Qwen2"), "qwen3": ("qwen3", "Qwen3"),
               "mistral": ("mistral", "Mistral"), "gemma3_text": ("gemma3", "Gemma3"),
               "qwen3_moe": ("qwen3_moe", "Qwen3Moe"), "mixtral": ("mixtral", "Mixtral")}
# the model fields besides Llama's that config.json sets (compared by check_config; config.json key in errors)
FAMILY_KEYS = {"family": "model_type", "attention_bias": "attention_bias", "qk_norm": "(the family's q/k norms)",
               "sliding_window": "sliding_window", "layer_types": "layer_types",
               "rope_local_theta": "rope_parameters.sliding_attention.rope_theta",
               "query_pre_attn_scalar": "query_pre_attn_scalar", "final_logit_softcapping": "final_logit_softcapping",
               "hidden_act": "hidden_activation", "num_experts": "num_experts (Mixtral: num_local_experts)",
               "num_experts_per_tok": "num_experts_per_tok", "moe_d_ff": "moe_intermediate_size",
               "norm_topk_prob": "norm_topk_prob"}


def model_type_of(family: str | None) -> str:
    """The config.json model_type of a `model.family` (null: llama)."""
    return next(t for t, (f, _) in MODEL_TYPES.items() if f == family)


def architecture(family: str | None, reward: bool = False) -> str:
    """The transformers class of a family's causal LM (`reward`: its one-label sequence classifier)."""
    return MODEL_TYPES[model_type_of(family)][1] + ("ForSequenceClassification" if reward else "ForCausalLM")


def check_family(hf: dict, reward: bool = False) -> None:
    """Reject a config.json of another model (type, class, biases or activation stack does not build)."""
    kind = hf.get("model_type")
    family = MODEL_TYPES.get(kind, ("?",))[0]
    want = architecture(family, reward) if kind in MODEL_TYPES else None
    archs = hf.get("architectures") or [want]
    if kind not in MODEL_TYPES or archs != [want]:
        types = ", ".join(MODEL_TYPES)
        what = "a one-label sequence classifier (reward model)" if reward else "a causal LM"
        raise ConfigError(f"config.json describes model_type={kind!r}, architectures={archs}; stack reads {what} "
                          f"of model_type {types} (Gemma 3's multimodal 'gemma3': its text_config as gemma3_text).")
    act = hf.get("hidden_activation", hf.get("hidden_act")) if family == "gemma3" else hf.get("hidden_act", "silu")
    bias_ok = (False, None) if family != "qwen2" else (False, None, True)
    unsupported = {k: hf[k] for k, ok in (("attention_bias", bias_ok), ("mlp_bias", (False, None)))
                   if k in hf and hf[k] not in ok}
    if act not in ("silu", "gelu_pytorch_tanh") or unsupported:
        raise ConfigError(f"config.json sets {unsupported or {'hidden_act': act}}, which stack's {kind} does not "
                          "support (no o_proj or MLP biases; SiLU or tanh-GELU gating).")


def family_fields(hf: dict) -> dict:
    """The model fields of a config.json's family keys (Llama's: all off)."""
    family = MODEL_TYPES[hf["model_type"]][0]
    out: dict[str, Any] = {"family": family, "attention_bias": family == "qwen2",
                           "qk_norm": family in ("qwen3", "gemma3", "qwen3_moe"), "sliding_window": None,
                           "layer_types": None, "rope_local_theta": None, "query_pre_attn_scalar": None,
                           "final_logit_softcapping": None, "hidden_act": None, **_experts(hf, family)}
    window = hf.get("sliding_window")
    if family in ("mistral", "mixtral") or (family in ("qwen2", "qwen3", "qwen3_moe") and hf.get("use_sliding_window")):
        out["sliding_window"] = window
        types = hf.get("layer_types")
        if family != "mistral" and types and "full_attention" in types:
            out["layer_types"] = list(types)
    if family == "gemma3":
        pattern = hf.get("sliding_window_pattern", 6)  # configs before layer_types
        out.update(sliding_window=window, layer_types=list(hf.get("layer_types") or [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(hf["num_hidden_layers"])]),
            rope_local_theta=float(_gemma_rope(hf)[1].get("rope_theta", hf.get("rope_local_base_freq", 10000.0))),
            query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
            final_logit_softcapping=hf.get("final_logit_softcapping"),
            hidden_act=hf.get("hidden_activation") or "gelu_pytorch_tanh")
    return out


def _experts(hf: dict, family: str | None) -> dict:
    """The routed-expert fields (stack.models.moe) of a Qwen3-MoE or Mixtral config.json (else off). Every
    layer routes (Qwen3-MoE's decoder_sparse_step 1, no mlp_only_layers); the load-balancing weight
    is taken where transformers adds the loss (output_router_logits)."""
    off = {"num_experts": None, "num_experts_per_tok": None, "moe_d_ff": None, "norm_topk_prob": False}
    if family not in ("qwen3_moe", "mixtral"):
        return off
    if hf.get("decoder_sparse_step", 1) != 1 or hf.get("mlp_only_layers"):
        raise ConfigError(f"config.json has dense layers among the experts (decoder_sparse_step="
                          f"{hf.get('decoder_sparse_step')}, mlp_only_layers={hf.get('mlp_only_layers')}); stack "
                          "builds every layer of a Qwen3-MoE with routed experts.")
    mixtral = family == "mixtral"
    return {"num_experts": hf["num_experts"] if "num_experts" in hf else hf["num_local_experts"],  # transformers 5
            # writes Qwen3-MoE's num_experts as num_local_experts (its attribute_map); the Hub's files num_experts
            "num_experts_per_tok": hf["num_experts_per_tok"],
            "moe_d_ff": None if mixtral else hf["moe_intermediate_size"],
            "norm_topk_prob": True if mixtral else bool(hf.get("norm_topk_prob", False)),
            "router_aux_loss_coef": hf.get("router_aux_loss_coef") if hf.get("output_router_logits") else None}


def _gemma_rope(hf: dict) -> tuple[dict, dict]:
    """Gemma 3's (full, sliding) rope parameters: transformers 5's per-layer-type dict, or the older
    top-level rope_theta / rope_scaling / rope_local_base_freq."""
    rope = hf.get("rope_parameters") or {}
    if "full_attention" in rope:
        return rope["full_attention"] or {}, rope.get("sliding_attention") or {}
    full = {**(hf.get("rope_scaling") or {}), "rope_theta": hf.get("rope_theta", 1_000_000.0)}
    return full, {"rope_theta": hf.get("rope_local_base_freq", 10000.0)}


def rope_of(hf: dict) -> dict:
    """The rope parameters of the full-attention layers (rope_theta, rope_type and its scaling keys)."""
    if hf.get("model_type") == "gemma3_text":
        return _gemma_rope(hf)[0]
    return {**(hf.get("rope_parameters") or {}), **(hf.get("rope_scaling") or {})}


def family_config(cfg: Any, rope: dict) -> dict:
    """The config.json keys of `cfg`'s family beside Llama's (`rope`: its full layers' parameters)."""
    family = cfg.family
    kind = model_type_of(family)
    out: dict[str, Any] = {"model_type": kind, "architectures": [architecture(family)]}
    types = list(cfg.layer_types) if cfg.layer_types else None
    if family == "gemma3":
        local = {"rope_type": "default", "rope_theta": float(cfg.rope_local_theta or rope["rope_theta"])}
        out |= {"rope_parameters": {"full_attention": rope, "sliding_attention": local},
                "sliding_window": cfg.sliding_window, "layer_types": types,
                "query_pre_attn_scalar": _integral(cfg.query_pre_attn_scalar), "hidden_activation": cfg.hidden_act,
                "final_logit_softcapping": cfg.final_logit_softcapping, "attn_logit_softcapping": None}
    elif family in ("mistral", "mixtral"):
        out["sliding_window"] = cfg.sliding_window
    if family == "mixtral":
        out |= {"num_local_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
                **_router_loss(cfg)}
    elif family == "qwen3_moe":
        out |= {"num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
                "moe_intermediate_size": cfg.moe_d_ff or cfg.d_ff, "norm_topk_prob": bool(cfg.norm_topk_prob),
                "decoder_sparse_step": 1, "mlp_only_layers": [], **_router_loss(cfg),
                "use_sliding_window": cfg.sliding_window is not None, "sliding_window": cfg.sliding_window}
    elif family in ("qwen2", "qwen3"):
        window = cfg.sliding_window
        out |= {"use_sliding_window": window is not None, "sliding_window": window, "max_window_layers": 0,
                "layer_types": types or ["sliding_attention" if window else "full_attention"] * cfg.n_layers}
    return out


def _router_loss(cfg: Any) -> dict:
    """config.json's load-balancing keys: transformers adds the loss with output_router_logits."""
    coef = getattr(cfg, "router_aux_loss_coef", None)
    return {"output_router_logits": coef is not None, **({"router_aux_loss_coef": coef} if coef is not None else {})}


def _integral(x: float) -> int | float:
    """`x` as an int when it is one (transformers' Gemma 3 config takes an int scalar)."""
    return int(x) if float(x).is_integer() else x
