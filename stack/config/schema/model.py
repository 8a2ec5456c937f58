"""Schema of the `model` group: a decoder's shape and numerics. A Llama by default; the family
keys (all off by default) make the other dense decoders (stack.models.family)."""

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class RopeScalingConfig:
    """RoPE frequency scaling, HF's `rope_parameters`: `type` default (none), llama3 (Llama 3.1+,
    transformers' `_compute_llama3_parameters`) or linear (frequencies / factor: Gemma 3's global
    layers); the other fields are read for llama3 only.
    From the command line: `model.rope_scaling.type=llama3 model.rope_scaling.factor=32`."""

    type: str = "default"  # default | llama3 | linear
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass
class ModelConfig:
    name: str = "llama"
    vocab_size: int = 384
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: Optional[int] = None  # None: d_model // n_heads
    d_ff: int = 176
    rope_theta: float = 10000.0
    rope_scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)
    max_seq_len: int = 2048
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    dtype: str = "float32"  # activation / compute dtype
    param_dtype: str = "float32"
    init_std: float = 0.02
    remat: str = "none"  # per decoder layer in training: none | full (recompute all) | dots (keep matmul outputs)
    # attention over whole sequences (stack.config.attention): core | splash (TPU) | xla | cudnn (GPU);
    # null: by hardware.platform (core on CPU and GPU, splash on TPU)
    attention: Optional[str] = None
    attention_block: Optional[int] = None  # splash's query/key block; null: the largest of 512/256/128 dividing T
    scan_layers: bool = False  # the layers as one jax.lax.scan: compiled once, gathered one at a time (deep models)
    init_from: Optional[str] = None  # hf:DIR (a local HF Llama) or a run's checkpoints dir
    # the family (HF model_type and weight names): null (llama) | qwen2 | qwen3 | mistral | gemma3 (its text decoder)
    # | qwen3_moe | mixtral
    family: Optional[str] = None
    attention_bias: bool = False  # biases on the q, k, v projections (Qwen2)
    qk_norm: bool = False  # an RMSNorm of each head's queries and keys before RoPE (Qwen3, Gemma 3)
    sliding_window: Optional[int] = None  # the tokens a sliding layer's query sees, itself included (Mistral, Gemma 3)
    # per layer: sliding_attention | full_attention; null: every layer sliding when sliding_window is set
    layer_types: Optional[List[str]] = None
    rope_local_theta: Optional[float] = None  # RoPE theta of sliding layers, unscaled (Gemma 3); null: as full ones
    query_pre_attn_scalar: Optional[float] = None  # scores scaled by its -1/2 power; null: head_dim's (Gemma 3)
    final_logit_softcapping: Optional[float] = None  # logits = c * tanh(logits / c) (Gemma)
    hidden_act: Optional[str] = None  # the MLP's gate activation: null (silu) | gelu_pytorch_tanh (Gemma)
    # mixture of experts (stack.models.moe): routed experts per layer in place of the MLP; null: a dense MLP
    num_experts: Optional[int] = None
    num_experts_per_tok: Optional[int] = None  # top-k experts per token
    moe_d_ff: Optional[int] = None  # each expert's hidden size (Qwen3-MoE's moe_intermediate_size); null: d_ff
    norm_topk_prob: bool = False  # the top-k routing weights renormalised to sum to 1 (Mixtral, Qwen3-MoE)
    router_aux_loss_coef: Optional[float] = None  # the load-balancing loss's weight in training; null: logged only
    path: Optional[str] = None  # model=hf: the local HF Llama dir whose config.json gives the architecture
