"""The platform attention kernels (stack.models.attention) against the CPU core: the Pallas splash
kernel in interpret mode and jax.nn.dot_product_attention's XLA implementation, forward and
gradients, with GQA, packed segments and left padding; the Llama forward with each kernel."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stack.config.attention import RUNS_ON, attention_kernel, check_attention
from stack.config.mesh import check_context
from stack.errors import ConfigError
from stack.models.attention import KERNELS, applies, platform_attention, splash_block
from stack.models.attention_core import causal_attention
from stack.models.init import init_model
from stack.models.llama import use_attention
from tests.helpers import forward, make_cfg


def segments(t: int) -> jnp.ndarray:
    """Row 0: three packed sequences; row 1: left padding (segment 0) then one sequence, as rollouts."""
    packed = (np.arange(t)[:, None] >= np.array([t // 4, t // 2 + 3])).sum(-1) + 1
    padded = (np.arange(t) >= t // 5).astype(np.int32)
    return jnp.asarray(np.stack([packed, padded]), jnp.int32)


def dense(seg: jnp.ndarray, window: int | None = None) -> jnp.ndarray:
    """The causal mask within segments (and a sliding window: key index > query index − window), by hand."""
    t = seg.shape[1]
    i = np.arange(t)
    band = (i[:, None] - i[None, :] < window) if window else np.ones((t, t), bool)
    return jnp.tril(jnp.ones((t, t), bool))[None] & (seg[:, :, None] == seg[:, None, :]) & band[None]


def inputs(t: int, heads: int, kv: int, hd: int, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(t + heads), 4)
    q = jax.random.normal(keys[0], (2, t, heads, hd), dtype)
    k, v = (jax.random.normal(key, (2, t, kv, hd), dtype) for key in keys[1:3])
    return q, k, v, jax.random.normal(keys[3], (2, t, heads, hd), dtype)


def kernel_fn(kernel: str, seg: jnp.ndarray, block: int | None = None, window: int | None = None,
              scale: float | None = None):
    if kernel == "core":
        return lambda q, k, v: causal_attention(q, k, v, dense(seg, window), scale).reshape(q.shape)
    return lambda q, k, v: platform_attention(kernel, q, k, v, seg, block, interpret=True, window=window, scale=scale)


@pytest.mark.parametrize("kernel, t, heads, kv, block, window, scale", [
    ("splash", 256, 4, 2, None, None, None), ("splash", 512, 4, 1, 128, None, None),
    ("splash", 256, 4, 4, None, None, None), ("xla", 256, 4, 2, None, None, None),
    ("splash", 256, 4, 2, 128, 100, 0.2), ("xla", 256, 4, 2, None, 100, 0.2)])  # a sliding layer, Gemma's scale
def test_forward_and_gradients_equal_the_core(kernel, t, heads, kv, block, window, scale):
    """float32: within 1e-5 (summation order differs: splash adds key blocks one at a time)."""
    q, k, v, cotangent = inputs(t, heads, kv, 64)
    seg = segments(t)
    got, got_vjp = jax.vjp(jax.jit(kernel_fn(kernel, seg, block, window, scale)), q, k, v)
    want, want_vjp = jax.vjp(jax.jit(kernel_fn("core", seg, window=window, scale=scale)), q, k, v)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    for g, w in zip(got_vjp(cotangent), want_vjp(cotangent), strict=True):
        assert np.abs(np.asarray(w)).max() > 0.1
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=2e-5)


def test_splash_in_bfloat16_is_within_its_rounding_of_float32():
    """bf16 inputs: the kernel's output within 2 % of the float32 core's largest value (bf16 keeps 8 bits
    of mantissa; the softmax and sums run in float32 inside the kernel)."""
    q, k, v, _ = inputs(256, 4, 2, 64, jnp.bfloat16)
    seg = segments(256)
    got = jax.jit(kernel_fn("splash", seg))(q, k, v)
    want = kernel_fn("core", seg)(*(x.astype(jnp.float32) for x in (q, k, v)))
    assert got.dtype == jnp.bfloat16
    assert np.abs(np.asarray(got, np.float32) - np.asarray(want)).max() < 0.02 * np.abs(np.asarray(want)).max()


def test_splash_blocks_divide_the_sequence_or_leave_it_to_the_core():
    assert [splash_block(t) for t in (1024, 768, 384, 96)] == [512, 256, 128, None]
    assert splash_block(512, 256) == 256 and splash_block(384, 256) is None
    assert applies("splash", 256) and not applies("splash", 100) and not applies("core", 256)
    assert applies("xla", 100)


def test_auto_picks_by_platform_and_an_explicit_choice_wins():
    cfg = make_cfg([])
    assert [attention_kernel(cfg.model, p) for p in ("cpu", "tpu")] == ["core", "splash"]
    assert attention_kernel(make_cfg(["model.attention=xla"]).model, "tpu") == "xla"
    gpu = ["hardware=gpu_h100", "model.head_dim=16"]  # bfloat16
    assert attention_kernel(make_cfg(gpu).model, "gpu") == "cudnn"
    assert attention_kernel(make_cfg([*gpu, "model.dtype=float32"]).model, "gpu") == "xla"  # cuDNN: bf16/fp16
    assert attention_kernel(make_cfg([*gpu, "model.head_dim=12"]).model, "gpu") == "xla"
    assert sorted(RUNS_ON) == sorted(KERNELS)


@pytest.mark.parametrize("overrides, platform, words", [
    (["model.attention=splash"], "gpu", "does not run on hardware.platform='gpu'"),
    (["model.attention=cudnn"], "tpu", "it runs on gpu"),
    (["model.attention=cudnn", "model.dtype=float32"], "gpu", "cannot run model.dtype='float32'"),
    (["model.attention=flash"], "tpu", "Unknown value 'flash' for 'model.attention'"),
    (["model.attention_block=100"], "tpu", "multiple of 128"),
    (["model.attention=splash", "data.seq_len=200"], "tpu", "does not divide data.seq_len=200"),
    (["model.attention=splash", "data.seq_len=256", "mesh=context", "mesh.context=4"], "tpu",
     "does not divide data.seq_len=256 / mesh.context=4")])
def test_a_kernel_that_cannot_run_is_refused_naming_the_key(overrides, platform, words):
    cfg = make_cfg(overrides)
    with pytest.raises(ConfigError, match=words.replace("(", "\\(")):
        check_attention(cfg.model, platform, cfg.data.seq_len, check_context(cfg.mesh, cfg.data.seq_len))


@pytest.mark.parametrize("overrides, words", [
    (["mesh=fsdp", "mesh.context=2"], "'mesh.context'=2 .* mesh.rules.length \\(now None\\).* use mesh=context"),
    (["mesh=context", "mesh.context=3", "data.seq_len=128"], "'mesh.context'=3 does not divide data.seq_len=128")])
def test_a_context_axis_that_cannot_split_the_sequence_is_refused(overrides, words):
    cfg = make_cfg(overrides)
    with pytest.raises(ConfigError, match=words):
        check_context(cfg.mesh, cfg.data.seq_len)


def test_the_context_option_splits_tokens_and_params_over_the_context_axis():
    cfg = make_cfg(["mesh=context", "mesh.context=4", "data.seq_len=256"])
    assert check_context(cfg.mesh, cfg.data.seq_len) == 4 and check_context(make_cfg([]).mesh, 128) == 1
    assert cfg.mesh.rules.length == "context" and list(cfg.mesh.rules.embed) == ["fsdp", "context"]


@pytest.mark.parametrize("kernel", ["splash", "xla"])
def test_llama_logits_and_gradients_with_a_platform_kernel_equal_the_core(kernel):
    cfg = make_cfg(["model.d_model=64", "model.n_heads=4", "model.n_kv_heads=2", "model.head_dim=64"])
    core = init_model(cfg.model, 0)
    other = use_attention(init_model(cfg.model, 0), kernel, interpret=True)
    tokens = jax.random.randint(jax.random.key(1), (2, 256), 0, cfg.model.vocab_size)
    seg = segments(256)
    positions = jnp.maximum(jnp.cumsum(seg > 0, axis=1) - 1, 0).astype(jnp.int32)
    np.testing.assert_allclose(np.asarray(forward(other, tokens, positions, seg)),
                               np.asarray(forward(core, tokens, positions, seg)), rtol=1e-4, atol=1e-4)

    def loss(model):
        return (model(tokens, positions, seg) * seg[..., None]).mean()

    got = nnx.jit(nnx.grad(loss))(other)
    want = nnx.jit(nnx.grad(loss))(core)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-6)
