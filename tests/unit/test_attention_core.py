"""stack.models.attention_core against a plain reference: HF LlamaAttention's eager core (K/V heads
repeated per query head, softmax of masked scaled scores, times V) by autodiff."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stack.models.attention_core import causal_attention, query_blocks
from tests.helpers import assert_same_vjp


def reference(q, k, v, mask):
    """q [B, T, H, hd], k and v [B, T, kv, hd], mask [B, T, T] -> [B, T, H*hd], as HF's eager path."""
    b, t, h, hd = q.shape
    k, v = (jnp.repeat(x, h // k.shape[2], axis=2) for x in (k, v))
    scores = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)
    probs = jax.nn.softmax(jnp.where(mask[:, None], scores, jnp.finfo(jnp.float32).min), axis=-1)
    return jnp.einsum("bhts,bshd->bthd", probs.astype(v.dtype), v).reshape(b, t, h * hd)


def packed_mask(t: int, b: int = 2) -> jnp.ndarray:
    """Causal within segments: row 0 one sequence, row 1 three packed ones (as Llama.hidden builds)."""
    cuts = np.array([[t, t, t], [t // 4, t // 2 + 3, t]])[:b]
    seg = (np.arange(t)[None, :, None] >= cuts[:, None, :]).sum(-1)
    same = seg[:, :, None] == seg[:, None, :]
    return jnp.asarray(np.tril(np.ones((t, t), bool)) & same)


def inputs(t: int, heads: int, kv: int, hd: int = 16, b: int = 2, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(t * 10 + heads), 4)
    q = jax.random.normal(keys[0], (b, t, heads, hd), dtype)
    k, v = (jax.random.normal(key, (b, t, kv, hd), dtype) for key in keys[1:3])
    return q, k, v, jax.random.normal(keys[3], (b, t, heads * hd), dtype)


@pytest.mark.parametrize("t, blocks", [(11, 1), (64, 1), (96, 1), (128, 2), (192, 2), (256, 4), (512, 8), (4096, 8)])
def test_query_blocks_are_equal_cuts_of_at_least_64_queries_at_most_8(t, blocks):
    assert query_blocks(t) == blocks


@pytest.mark.parametrize("t, heads, kv", [(11, 4, 2), (128, 4, 2), (256, 4, 4), (512, 4, 1)])
def test_forward_and_gradients_equal_the_reference(t, heads, kv):
    """1, 2, 4 and 8 query blocks; grouped (2 and 4 query heads a kv head) and multi-head; packed rows."""
    q, k, v, cotangent = inputs(t, heads, kv)
    mask = packed_mask(t)
    np.testing.assert_allclose(np.asarray(causal_attention(q, k, v, mask)), np.asarray(reference(q, k, v, mask)),
                               rtol=1e-5, atol=1e-6)
    assert_same_vjp(lambda *a: causal_attention(*a, mask), lambda *a: reference(*a, mask), (q, k, v), cotangent)


def test_bfloat16_keeps_its_dtype_and_is_near_the_float32_reference():
    q, k, v, cotangent = inputs(128, 4, 2, dtype=jnp.bfloat16)
    mask = packed_mask(128)
    out, vjp = jax.vjp(lambda *a: causal_attention(*a, mask), q, k, v)
    assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in vjp(cotangent))
    f32 = [x.astype(jnp.float32) for x in (q, k, v, cotangent)]
    want, want_vjp = jax.vjp(lambda *a: reference(*a, mask), *f32[:3])
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want), atol=0.05)
    for got, w in zip(vjp(cotangent), want_vjp(f32[3]), strict=True):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(w), atol=0.1 * float(jnp.abs(w).max()))
