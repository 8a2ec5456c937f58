"""Rotary position embeddings as HF Llama computes them: the inverse frequencies (with the
llama3 scaling of Llama 3.1+, or linear scaling: Gemma 3's global layers) and the rotate-half rotation."""

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from stack.models.shape import RopeScaling

Array = jax.Array


def rope_inv_freq(head_dim: int, theta: float, scaling: Optional[RopeScaling] = None) -> np.ndarray:
    """RoPE inverse frequencies [head_dim // 2] (float32); HF's llama3 or linear scaling unless None / default."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if scaling is None or scaling.type == "default":
        return inv_freq.astype(np.float32)
    if scaling.type == "linear":  # transformers' _compute_linear_scaling_rope_parameters
        return (inv_freq / scaling.factor).astype(np.float32)
    if scaling.type != "llama3":
        raise ValueError(f"unsupported rope_scaling.type {scaling.type!r} (llama3 or linear)")
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    old_len = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def rope_tables(positions: Array, inv_freq: np.ndarray | Array, rows: Optional[int] = None) -> tuple[Array, Array]:
    """(cos, sin) [B, T, 1, D] of the rotation angles at positions [B, T], float32, once per forward
    for every layer (as HF's LlamaRotaryEmbedding). With `rows`, the rows of a [rows, D] table of
    positions 0..rows-1 (a position outside clips to its ends): XLA:CPU fuses cos and sin into each
    use and evaluates them per element, per head and layer; gathering from the small table is faster."""
    steps = jnp.arange(rows) if rows is not None else positions
    angles = steps[..., None].astype(jnp.float32) * jnp.asarray(inv_freq, jnp.float32)
    tables = (jnp.cos(angles), jnp.sin(angles))
    if rows is not None:
        tables = tuple(jnp.take(t, positions, axis=0, mode="clip") for t in tables)
    return tuple(jnp.concatenate([t, t], axis=-1)[:, :, None, :] for t in tables)


def apply_rope(x: Array, tables: tuple[Array, Array]) -> Array:
    """Rotate-half RoPE (HF Llama convention) on x [B, T, H, D] with `rope_tables`."""
    cos, sin = tables
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)
