"""The decoder families as a few differences from Llama (each as its transformers model computes it):

- qwen2 (Qwen2.5): biases on the q, k and v projections;
- qwen3: an RMSNorm over each head's queries and keys before RoPE (`qk_norm`), explicit head_dim;
- mistral: sliding-window attention, every layer (a query sees the `sliding_window` tokens up to
  itself: transformers' sliding_window_overlay, key index > query index − window);
- qwen3_moe, mixtral: top-k routed experts in place of the MLP (stack.models.moe);
- gemma3 (the text decoder): sliding and full layers (`layer_types`), the sliding ones with their own
  unscaled RoPE theta (`rope_local_theta`), qk_norm, scores scaled by query_pre_attn_scalar^−1/2,
  GELU (tanh) gating, norms that scale by (1 + w), a norm after attention and after the MLP as
  well as before, embeddings × sqrt(d_model), tied embeddings, optional final logit soft-capping.

`Variant` is what the modules read; any `model` config (or object with its fields) gives one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Variant:
    """A decoder's differences from Llama (hashable: modules keep it as a static attribute)."""

    family: str = "llama"
    attention_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    sliding: tuple[bool, ...] = ()  # per layer: a sliding-window layer
    rope_local_theta: float | None = None
    query_scale: float | None = None  # the scores' scale; None: head_dim^−1/2
    final_softcap: float | None = None
    act: str = "silu"
    experts: int = 0  # routed experts per layer (0: a dense MLP)
    top_k: int = 0
    expert_ff: int = 0
    norm_topk: bool = False

    @property
    def gemma(self) -> bool:
        """Gemma's norms: (1 + w), before and after attention and the MLP; embeddings × sqrt(d_model)."""
        return self.family == "gemma3"

    def window(self, layer: int) -> int | None:
        """The sliding window of layer `layer`, None for a full-attention layer."""
        return self.sliding_window if self.sliding and self.sliding[layer] else None


def variant_of(cfg: Any) -> Variant:
    """The Variant of a `model` config (fields it lacks: Llama's)."""
    get = lambda key, default=None: getattr(cfg, key, default)  # noqa: E731
    window = get("sliding_window")
    types = get("layer_types")
    sliding = tuple(t == "sliding_attention" for t in types) if types else (window is not None,) * cfg.n_layers
    scalar = get("query_pre_attn_scalar")
    return Variant(family=get("family") or "llama", attention_bias=bool(get("attention_bias", False)),
                   qk_norm=bool(get("qk_norm", False)), sliding_window=window,
                   sliding=sliding if window is not None else (False,) * cfg.n_layers,
                   rope_local_theta=get("rope_local_theta"),
                   query_scale=None if scalar is None else 1 / math.sqrt(scalar),
                   final_softcap=get("final_logit_softcapping"), act=get("hidden_act") or "silu",
                   experts=get("num_experts") or 0, top_k=get("num_experts_per_tok") or 0,
                   expert_ff=get("moe_d_ff") or cfg.d_ff, norm_topk=bool(get("norm_topk_prob", False)))
