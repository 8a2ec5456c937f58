"""Llama model against independent references: published parameter counts, Meta's RoPE
scaling formula, and a float64 NumPy forward pass written here from the same weights."""

import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stack.config.schema.model import ModelConfig, RopeScalingConfig
from stack.models import modules
from stack.models.init import abstract_model, init_model, param_count
from stack.models.llama import Llama, unfuse
from stack.models.modules import copy_module
from stack.models.rope import apply_rope, rope_inv_freq, rope_tables
from tests.helpers import forward, make_cfg, xla_compiles

LOGICAL = {"vocab", "embed", "heads", "kv_heads", "head_dim", "mlp", "norm"}


def load_cfg(name: str):
    """The model node as composed (dtypes come from the hardware group's defaults)."""
    return make_cfg([f"model={name}", "hardware=tpu_v5e"]).model


def tiny_cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=80)
    return ModelConfig(**{**base, **kw})


def randomized(cfg, seed: int = 0) -> Llama:
    """A model whose every parameter (norm weights included) is O(1) random, from NumPy."""
    model = abstract_model(cfg)
    rng = np.random.default_rng(seed)

    def draw(x):
        w = rng.normal(size=x.shape) * (0.5 if len(x.shape) == 1 else 1 / math.sqrt(x.shape[0]))
        return jnp.asarray(w + (len(x.shape) == 1), x.dtype)

    nnx.update(model, jax.tree.map(draw, nnx.state(model, nnx.Param)))
    return model


# ---------------------------------------------------------------- independent references
def meta_llama3_inv_freq(head_dim, theta, factor, low, high, old_len):
    """Meta's `apply_scaling` (llama-models), scalar loop over frequencies, float64."""
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:
            out.append(freq)
        elif wavelen > old_len / low:
            out.append(freq / factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return np.array(out)


def np_rope(x, positions, inv_freq):
    """Rotate-half RoPE as complex multiplication of (x_i + j x_{i+D/2}) by e^{j p f_i}."""
    half = x.shape[-1] // 2
    z = x[..., :half] + 1j * x[..., half:]
    z = z * np.exp(1j * positions[:, :, None, None] * inv_freq)
    return np.concatenate([z.real, z.imag], axis=-1)


def np_rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def np_forward(p, cfg, inv_freq, tokens, positions, segment_ids=None):
    """Float64 Llama forward from a pure param dict; GQA via np.repeat (HF repeat_kv)."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
    b, t = tokens.shape
    nh, nkv = cfg.n_heads, cfg.n_kv_heads
    hd = cfg.head_dim or cfg.d_model // nh
    allowed = np.tril(np.ones((t, t), bool))[None]
    if segment_ids is not None:
        allowed = allowed & (segment_ids[:, :, None] == segment_ids[:, None, :])
    x = p["embed"]["embedding"][tokens]
    for i in range(cfg.n_layers):
        lp = p["layers"][i]
        a = lp["attn"]
        h = np_rms(x, lp["attn_norm"]["weight"], cfg.norm_eps)
        q = np_rope((h @ a["q_proj"]["kernel"]).reshape(b, t, nh, hd), positions, inv_freq)
        k = np_rope((h @ a["k_proj"]["kernel"]).reshape(b, t, nkv, hd), positions, inv_freq)
        v = (h @ a["v_proj"]["kernel"]).reshape(b, t, nkv, hd)
        k, v = np.repeat(k, nh // nkv, axis=2), np.repeat(v, nh // nkv, axis=2)
        s = np.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)
        s = np.where(allowed[:, None], s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        x = x + np.einsum("bhts,bshd->bthd", w, v).reshape(b, t, nh * hd) @ a["o_proj"]["kernel"]
        m = lp["mlp"]
        h = np_rms(x, lp["mlp_norm"]["weight"], cfg.norm_eps)
        g = h @ m["gate_proj"]["kernel"]
        x = x + (g / (1 + np.exp(-g)) * (h @ m["up_proj"]["kernel"])) @ m["down_proj"]["kernel"]
    x = np_rms(x, p["norm"]["weight"], cfg.norm_eps)
    head = p["embed"]["embedding"].T if cfg.tie_embeddings else p["lm_head"]["kernel"]
    return x @ head


# ---------------------------------------------------------------- parameter counts
def closed_form_count(c) -> int:
    hd = c.head_dim or c.d_model // c.n_heads
    layer = c.d_model * hd * 2 * (c.n_heads + c.n_kv_heads) + 3 * c.d_model * c.d_ff + 2 * c.d_model
    return c.n_layers * layer + c.vocab_size * c.d_model * (1 if c.tie_embeddings else 2) + c.d_model


@pytest.mark.parametrize("name,published", [("llama3_1b", 1.24e9), ("llama3_8b", 8.03e9),
                                            ("llama3_70b", 70.6e9)])
def test_param_count_matches_published(name, published):
    cfg = load_cfg(name)
    n = param_count(cfg)
    assert abs(n - published) / published < 0.005, n
    assert n == closed_form_count(cfg)


def test_abstract_model_metadata_and_paths():
    model = abstract_model(load_cfg("llama3_1b"))  # tied: no lm_head
    params = nnx.state(model, nnx.Param)
    for path, var in nnx.to_flat_state(params):
        names = var.get_metadata()["out_sharding"]
        assert isinstance(var.get_value(), jax.ShapeDtypeStruct), path
        assert len(names) == len(var.get_value().shape) and set(names) <= LOGICAL, (path, names)
    pure = nnx.to_pure_dict(params)
    assert "lm_head" not in pure and len(pure["layers"]) == 16
    assert set(pure["layers"][0]) == {"attn", "mlp", "attn_norm", "mlp_norm"}
    assert set(pure["layers"][0]["attn"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert set(pure["layers"][0]["mlp"]) == {"gate_proj", "up_proj", "down_proj"}
    assert "lm_head" in nnx.to_pure_dict(nnx.state(abstract_model(tiny_cfg()), nnx.Param))


def test_init_model():
    cfg = tiny_cfg(init_std=0.05)
    model = init_model(cfg, 0)
    np.testing.assert_array_equal(np.asarray(model.norm.weight[...]), np.ones(cfg.d_model))
    for w in (model.embed.embedding, model.layers[1].attn.k_proj.kernel, model.lm_head.kernel):
        w = np.asarray(w[...])
        assert abs(w.std() / 0.05 - 1) < 0.15 and abs(w.mean()) < 4 * 0.05 / math.sqrt(w.size)
    k, v = (np.asarray(p.kernel[...]) for p in (model.layers[0].attn.k_proj, model.layers[0].attn.v_proj))
    assert not np.allclose(k, v)  # every parameter draws its own key
    assert not nnx.state(model, nnx.RngState)  # no generator state kept in the model


@pytest.mark.parametrize("layers,tie,leaves", [(2, False, 21), (3, True, 29)])
def test_init_draws_the_bits_of_one_program_building_the_whole_model(layers, tie, leaves):
    """init_model runs a program without the layers, then one per layer at -O1 (XLA:CPU); the
    reference: the whole build as one program at XLA:CPU's default -O2 (named: tests run at -O0)."""
    cfg = tiny_cfg(init_std=0.05, n_layers=layers, tie_embeddings=tie)
    with nnx.use_eager_sharding(False):
        theirs = jax.tree.leaves(jax.jit(lambda: nnx.state(Llama(cfg, rngs=nnx.Rngs(3))),
                                         compiler_options={"xla_backend_optimization_level": 2})())
    ours = jax.tree.leaves(nnx.state(init_model(cfg, 3)))
    assert len(ours) == len(theirs) == leaves  # layers x 9, embed, norm (, lm_head)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_init_compiles_one_layer_program_whatever_the_depth(caplog):
    """(A shape no other test builds, so no program is cached in this process already.)"""
    with jax.log_compiles(), caplog.at_level(logging.WARNING):
        model = init_model(tiny_cfg(d_model=48, n_layers=5), 0)
    compiled = [r.getMessage() for r in caplog.records if "XLA compilation of jit(" in r.getMessage()]
    assert sum("jit(one_layer)" in m for m in compiled) == 1 and len(model.layers) == 5, compiled
    assert not np.allclose(np.asarray(model.layers[0].attn.q_proj.kernel[...]),
                           np.asarray(model.layers[4].attn.q_proj.kernel[...]))


def test_copy_module_gives_each_array_its_own_equal_buffer_and_keeps_shape_only_leaves(monkeypatch):
    model, shapes = init_model(tiny_cfg(), 0), abstract_model(tiny_cfg())
    with xla_compiles() as compiles:
        copy = copy_module(model)
    assert compiles == []  # copied by the runtime: no program
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(copy)), strict=True):
        assert a.unsafe_buffer_pointer() != b.unsafe_buffer_pointer() and a.sharding == b.sharding
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    copy.norm.weight[...] = 0.0  # the copy is its own module
    np.testing.assert_array_equal(np.asarray(model.norm.weight[...]), 1.0)
    monkeypatch.setattr(modules.jax, "device_put", None)  # shape-only (mode=compile): no copy, no backend
    abstract = jax.tree.leaves(nnx.state(copy_module(shapes)))
    assert abstract == jax.tree.leaves(nnx.state(shapes)) and isinstance(abstract[0], jax.ShapeDtypeStruct)


# ---------------------------------------------------------------- RoPE
@pytest.mark.parametrize("factor,theta", [(8.0, 500000.0), (32.0, 500000.0)])
def test_llama3_scaled_inv_freq(factor, theta):
    scaling = RopeScalingConfig(type="llama3", factor=factor, low_freq_factor=1.0, high_freq_factor=4.0,
                                original_max_position_embeddings=8192)
    got = rope_inv_freq(128, theta, scaling)
    want = meta_llama3_inv_freq(128, theta, factor, 1.0, 4.0, 8192)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    plain = meta_llama3_inv_freq(128, theta, 1.0, 1.0, 4.0, 8192)
    ratio = plain / want  # all three regimes are exercised: kept, interpolated, divided
    assert np.isclose(ratio, 1).any() and np.isclose(ratio, factor).any()
    assert ((ratio > 1.01) & (ratio < factor - 0.01)).any()


def test_unscaled_rope_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 7, 3, 16)).astype(np.float32)
    pos = rng.integers(0, 5000, size=(2, 7))
    inv = 1.0 / 10000.0 ** (np.arange(0, 16, 2) / 16)
    np.testing.assert_allclose(rope_inv_freq(16, 10000.0), inv, rtol=1e-6)
    got = apply_rope(jnp.asarray(x), rope_tables(jnp.asarray(pos, jnp.int32), rope_inv_freq(16, 10000.0)))
    np.testing.assert_allclose(np.asarray(got), np_rope(x.astype(np.float64), pos, inv), atol=2e-3)
    small = rng.integers(0, 64, size=(2, 7))  # tight where float32 angles are exact enough
    got = apply_rope(jnp.asarray(x), rope_tables(jnp.asarray(small, jnp.int32), rope_inv_freq(16, 10000.0)))
    np.testing.assert_allclose(np.asarray(got), np_rope(x.astype(np.float64), small, inv), atol=1e-5)



def test_rope_rows_gather_the_same_angles_and_clip_outside():
    """`rows=N` (the training forward) gathers from a table of positions 0..N-1: bit-equal to
    computing each position's angles, and a position outside the table takes its nearest end."""
    inv = rope_inv_freq(16, 10000.0)
    pos = jnp.asarray(np.random.default_rng(3).integers(0, 40, size=(2, 9)), jnp.int32)
    for got, want in zip(rope_tables(pos, inv, rows=40), rope_tables(pos, inv), strict=True):
        assert got.shape == (2, 9, 1, 16)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    outside = jnp.asarray([[-1, 0, 39, 40, 55]], jnp.int32)
    clipped = jnp.asarray([[0, 0, 39, 39, 39]], jnp.int32)
    for got, want in zip(rope_tables(outside, inv, rows=40), rope_tables(clipped, inv), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

# ---------------------------------------------------------------- full forward
@pytest.mark.parametrize("tied,scaled", [(False, False), (True, True)])
def test_forward_matches_numpy(tied, scaled):
    scaling = RopeScalingConfig(type="llama3", factor=4.0, original_max_position_embeddings=32) if scaled else None
    cfg = tiny_cfg(tie_embeddings=tied, rope_scaling=scaling)
    model = randomized(cfg)
    hd = cfg.d_model // cfg.n_heads
    inv = (meta_llama3_inv_freq(hd, cfg.rope_theta, 4.0, 1.0, 4.0, 32) if scaled
           else 1.0 / cfg.rope_theta ** (np.arange(0, hd, 2) / hd))
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, size=(2, 11))
    positions = np.broadcast_to(np.arange(11), (2, 11))
    got = forward(model, jnp.asarray(tokens, jnp.int32))
    assert got.dtype == jnp.float32 and got.shape == (2, 11, cfg.vocab_size)
    want = np_forward(nnx.to_pure_dict(nnx.state(model, nnx.Param)), cfg, inv, tokens, positions)
    assert np.abs(want).max() > 0.5  # logits are O(1), so 1e-4 is a real tolerance
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=1e-4)


def test_fused_projections_equal_the_separate_ones_in_logits_and_gradients():
    """The default MLP (gate and up as one product of stacked kernels), attention (Q, K, V as one
    product) and attention core (stack.models.attention_core, 2 query blocks at 128 tokens) against
    `unfuse` (each projection its own call, as Qwix needs, and the core by autodiff): the loss (rtol
    1e-6) and every gradient (rtol 1e-5, atol 1e-6) equal in fp32."""
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, 97, size=(2, 128)), jnp.int32)

    def loss_and_grads(model):
        return nnx.value_and_grad(lambda m: (forward(m, tokens) ** 2).mean())(model)

    model = randomized(tiny_cfg())
    assert all(layer.mlp.fused and layer.attn.fused for layer in model.layers)
    fused = loss_and_grads(model)
    assert unfuse(model) is model
    assert not any(layer.mlp.fused or layer.attn.fused for layer in model.layers)
    unfused = loss_and_grads(model)
    np.testing.assert_allclose(float(fused[0]), float(unfused[0]), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(nnx.state(fused[1])), jax.tree.leaves(nnx.state(unfused[1])), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_causality():
    model = randomized(tiny_cfg())
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 97, size=(2, 11))
    changed = tokens.copy()
    changed[:, 6:] = rng.integers(0, 97, size=(2, 5))
    a = np.asarray(forward(model, jnp.asarray(tokens, jnp.int32)))
    b = np.asarray(forward(model, jnp.asarray(changed, jnp.int32)))
    np.testing.assert_allclose(a[:, :6], b[:, :6], atol=1e-6)
    assert np.abs(a[:, 6:] - b[:, 6:]).max() > 1e-3


def test_packed_segments():
    cfg = tiny_cfg()
    model = randomized(cfg)
    seg_a, seg_b = jnp.array([[5, 17, 42]]), jnp.array([[8, 3, 64]])
    packed = jnp.concatenate([seg_a, seg_b], axis=1).astype(jnp.int32)
    positions = jnp.array([[0, 1, 2, 0, 1, 2]], jnp.int32)
    segments = jnp.array([[1, 1, 1, 2, 2, 2]], jnp.int32)
    got = np.asarray(forward(model, packed, positions, segments))
    alone_b = np.asarray(forward(model, seg_b.astype(jnp.int32)))
    alone_a = np.asarray(forward(model, seg_a.astype(jnp.int32)))
    np.testing.assert_allclose(got[:, 3:], alone_b, atol=1e-5)
    np.testing.assert_allclose(got[:, :3], alone_a, atol=1e-5)
    other_a = packed.at[0, :3].set(jnp.array([9, 9, 1], jnp.int32))
    np.testing.assert_allclose(np.asarray(forward(model, other_a, positions, segments))[:, 3:], alone_b,
                               atol=1e-5)
    want = np_forward(nnx.to_pure_dict(nnx.state(model, nnx.Param)), cfg,
                      1.0 / cfg.rope_theta ** (np.arange(0, 8, 2) / 8), np.asarray(packed),
                      np.asarray(positions), np.asarray(segments))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    padded = np.asarray(forward(model, packed, positions, jnp.array([[1, 1, 1, 0, 0, 0]], jnp.int32)))
    assert np.isfinite(padded).all()


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_bfloat16_forward(param_dtype):
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 97, size=(2, 11)), jnp.int32)
    ref = np.asarray(forward(randomized(tiny_cfg()), tokens))
    model = randomized(tiny_cfg(dtype="bfloat16", param_dtype=param_dtype))
    assert model.layers[0].mlp.up_proj.kernel[...].dtype == jnp.dtype(param_dtype)
    got = forward(model, tokens)
    assert got.dtype == jnp.float32 and np.isfinite(np.asarray(got)).all()
    err = np.abs(np.asarray(got) - ref).max() / np.abs(ref).max()
    assert err < 0.1, err  # same weights up to bf16 rounding: close, not equal


def test_remat_recomputes_layers_with_the_same_gradients_in_less_memory():
    """model.remat=full/dots: loss and gradients equal no remat (fp32, 1e-6); the compiled
    backward of `full` keeps fewer temporaries (XLA's memory analysis of the same program)."""
    tokens = jax.random.randint(jax.random.key(1), (4, 64), 0, 384)

    def grads(remat: str):
        model = init_model(make_cfg([f"model.remat={remat}", "model.n_layers=4"]).model, 0)
        graphdef, params = nnx.split(model)
        loss = lambda p: nnx.merge(graphdef, p)(tokens).mean()  # noqa: E731
        step = jax.jit(jax.value_and_grad(loss))
        temp = step.lower(params).compile().memory_analysis().temp_size_in_bytes
        return step(params), temp

    (want, want_grads), plain = grads("none")
    temps = {}
    for remat in ("full", "dots"):
        (got, got_grads), temps[remat] = grads(remat)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got_grads, want_grads)
    assert temps["full"] < plain, (temps, plain)


def test_scan_layers_computes_the_same_loss_and_gradients_from_one_compiled_layer():
    """model.scan_layers=true (one jax.lax.scan over the stacked layer params), with and without
    remat: loss and gradients equal the unrolled loop (fp32, 1e-6 / 1e-5); the lowered program
    holds one layer body, so its matmul count does not grow with depth (unrolled: it does)."""
    tokens = jax.random.randint(jax.random.key(2), (2, 32), 0, 384)

    def lowered(layers: int, scan: bool, remat: str = "none"):
        """(the jitted loss-and-gradient step, its params, the lowered program's matmul count)"""
        cfg = make_cfg([f"model.scan_layers={scan}", f"model.remat={remat}", f"model.n_layers={layers}"])
        graphdef, params = nnx.split(init_model(cfg.model, 0))
        loss = lambda p: nnx.merge(graphdef, p)(tokens).mean()  # noqa: E731
        step = jax.jit(jax.value_and_grad(loss))
        return step, params, step.lower(params).as_text().count("dot_general")

    step, params, unrolled = lowered(4, False)
    want, want_grads = step(params)
    for remat in ("full", "none"):
        step, params, scanned = lowered(4, True, remat)
        got, got_grads = step(params)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got_grads, want_grads)
    # scanned: without remat; 8 layers: lowered only
    assert lowered(8, True)[2] == scanned < unrolled < lowered(8, False)[2]
