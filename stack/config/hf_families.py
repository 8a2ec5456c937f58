"""The decoder families in a Hugging Face `config.json` (transformers 5's keys; stack.models.family):
which `model_type` is which family, the `model` fields each family's keys set, and the keys an
export writes. Without jax (preflight reads it)."""

from __future__ import annotations

from typing import Any

from stack.errors import ConfigError

# config.json model_type -> (model.family, the class prefix of its architectures)
MODEL_TYPES = {"llama": (None, "Llama"), "qwen2": ("qwen2", "Qwen2"), "qwen3": ("qwen3", "Qwen3"),
               "mistral": ("mistral", "Mistral"), "gemma3_text": ("gemma3", "Gemma3")}
# the model fields besides Llama's that config.json sets (compared by check_config; config.json key in errors)
FAMILY_KEYS = {"family": "model_type", "attention_bias": "attention_bias", "qk_norm": "(the family's q/k norms)",
               "sliding_window": "sliding_window", "layer_types": "layer_types",
               "rope_local_theta": "rope_parameters.sliding_attention.rope_theta",
               "query_pre_attn_scalar": "query_pre_attn_scalar", "final_logit_softcapping": "final_logit_softcapping",
               "hidden_act": "hidden_activation"}


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
                           "qk_norm": family in ("qwen3", "gemma3"), "sliding_window": None, "layer_types": None,
                           "rope_local_theta": None, "query_pre_attn_scalar": None, "final_logit_softcapping": None,
                           "hidden_act": None}
    window = hf.get("sliding_window")
    if family == "mistral" or (family in ("qwen2", "qwen3") and hf.get("use_sliding_window")):
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
    elif family == "mistral":
        out["sliding_window"] = cfg.sliding_window
    elif family in ("qwen2", "qwen3"):
        window = cfg.sliding_window
        out |= {"use_sliding_window": window is not None, "sliding_window": window, "max_window_layers": 0,
                "layer_types": types or ["sliding_attention" if window else "full_attention"] * cfg.n_layers}
    return out


def _integral(x: float) -> int | float:
    """`x` as an int when it is one (transformers' Gemma 3 config takes an int scalar)."""
    return int(x) if float(x).is_integer() else x
