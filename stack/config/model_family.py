"""Checks of the `model` group's family keys (stack.models.family), without jax."""

from omegaconf import DictConfig

from stack.errors import ConfigError, bad_choice

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma3", "qwen3_moe", "mixtral")
LAYER_TYPES = ("full_attention", "sliding_attention")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


def check_family(m: DictConfig) -> None:
    """The family, activation, sliding window and layer types a decoder can be built with."""
    if m.family is not None and m.family not in FAMILIES:
        raise bad_choice("model.family", m.family, FAMILIES)
    if m.hidden_act is not None and m.hidden_act not in ACTIVATIONS:
        raise bad_choice("model.hidden_act", m.hidden_act, ACTIVATIONS)
    for key in ("sliding_window", "query_pre_attn_scalar", "final_logit_softcapping", "rope_local_theta"):
        if m[key] is not None and not m[key] > 0:
            raise ConfigError(f"'model.{key}'={m[key]} must be null (off) or > 0.")
    _check_layer_types(m)
    _check_experts(m)


def _check_experts(m: DictConfig) -> None:
    experts, k = m.num_experts, m.num_experts_per_tok
    if experts is None and k is None:
        return
    if experts is None or k is None or experts < 2 or not 1 <= k <= experts:
        raise ConfigError(f"'model.num_experts'={experts} and 'model.num_experts_per_tok'={k}: routed experts need "
                          "both, at least 2 experts and 1 <= experts per token <= num_experts (or both null: a "
                          "dense MLP).")
    if m.moe_d_ff is not None and m.moe_d_ff < 1:
        raise ConfigError(f"'model.moe_d_ff'={m.moe_d_ff} must be null (model.d_ff) or >= 1.")


def _check_layer_types(m: DictConfig) -> None:
    types = None if m.layer_types is None else list(m.layer_types)
    if types is None:
        return
    if m.sliding_window is None:
        raise ConfigError("'model.layer_types' is set but 'model.sliding_window' is null: sliding_attention layers "
                          "need a window (model.sliding_window=N tokens), or drop layer_types.")
    if len(types) != m.n_layers or any(t not in LAYER_TYPES for t in types):
        raise ConfigError(f"'model.layer_types'={types}: one entry per layer (model.n_layers={m.n_layers}), each "
                          f"one of {', '.join(LAYER_TYPES)}.")
    if m.scan_layers and len(set(types)) > 1:
        raise ConfigError(f"model.scan_layers=true runs one compiled layer for all, and 'model.layer_types' mixes "
                          f"{' and '.join(LAYER_TYPES)} layers (their attention differs); set model.scan_layers=false.")
