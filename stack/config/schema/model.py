"""Schema of the `model` group: a Llama-family decoder's shape and numerics."""

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class RopeScalingConfig:
    """RoPE frequency scaling, HF's `rope_parameters`: `type` default (none) or llama3 (Llama 3.1+,
    transformers' `_compute_llama3_parameters`); the other fields are read for llama3 only.
    From the command line: `model.rope_scaling.type=llama3 model.rope_scaling.factor=32`."""

    type: str = "default"  # default | llama3
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
    path: Optional[str] = None  # model=hf: the local HF Llama dir whose config.json gives the architecture
