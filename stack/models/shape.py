"""What a decoder is built from: the attributes the models read, as structural types. A `model`
config has them all, and so does any object with these fields; the models read them while they
build and keep none of it (no config object lives in a module or its graph)."""

from typing import Protocol


class RopeScaling(Protocol):
    """RoPE frequency scaling (HF's `rope_parameters`): `type` default or llama3."""

    type: str
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


class LlamaShape(Protocol):
    """A Llama-family decoder's shape and numerics (`remat` and `scan_layers` are read when present)."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int | None  # None: d_model // n_heads
    d_ff: int
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_seq_len: int  # the longest sequence (HF's max_position_embeddings)
    norm_eps: float
    tie_embeddings: bool
    dtype: str
    param_dtype: str
    init_std: float
