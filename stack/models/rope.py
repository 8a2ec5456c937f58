"""Rotary position embeddings as HF Llama computes them: the inverse frequencies (with the
llama3 scaling of Llama 3.1+) and the rotate-half rotation."""

import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def rope_inv_freq(head_dim: int, theta: float, scaling: Optional[Any] = None) -> np.ndarray:
    """RoPE inverse frequencies [head_dim // 2] (float32); HF's llama3 scaling unless None / default."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if scaling is None or scaling.type == "default":
        return inv_freq.astype(np.float32)
    if scaling.type != "llama3":
        raise ValueError(f"unsupported rope_scaling.type {scaling.type!r} (only 'llama3')")
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    old_len = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def apply_rope(x: Array, positions: Array, inv_freq: np.ndarray | Array) -> Array:
    """Rotate-half RoPE (HF Llama convention) on x [B, T, H, D] at positions [B, T]."""
    angles = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq, jnp.float32)
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, T, 1, D]
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x32 * jnp.cos(angles) + rotated * jnp.sin(angles)).astype(x.dtype)
