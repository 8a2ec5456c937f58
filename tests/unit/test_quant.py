"""The quantization providers (stack.quant): QAT against a NumPy fake quantization, rule checks
before compute, the float view of a QAT model, and LoRA/QLoRA adapters merged for export."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stack.config.validate import validate
from stack.errors import ConfigError
from stack.models.init import init_model
from stack.models.llama import unfuse
from stack.quant.providers import make_quantization, unquantized
from tests.helpers import forward, make_cfg
from tests.unit.test_lora import random_adapters, tokens

BOUND = {"int8": (127.5, -128, 127), "int4": (7.5, -8, 7)}  # Qwix numerics: symmetric bound = qmax + 0.5


def fake_quant(w: np.ndarray, qtype: str, axis: int, tile: int | None = None) -> np.ndarray:
    """Symmetric absmax fake quantization (Qwix's convention: scale = absmax / (qmax + 0.5),
    q = round-half-even(x / scale) clipped to the integer range, float32), one scale per slice
    along `axis` (the contraction axis), or per `tile` elements of it."""
    bound, lo, hi = BOUND[qtype]
    w = np.moveaxis(w, axis, -1)
    shape = w.shape
    tiles = w.reshape(*shape[:-1], -1, tile or shape[-1])
    scale = (np.abs(tiles).max(-1, keepdims=True) / np.float32(bound)).astype(np.float32)
    out = np.clip(np.rint(tiles / scale), lo, hi) * scale
    return np.moveaxis(out.reshape(shape), -1, axis)


def untied(w: np.ndarray, axis: int, tile: int | None = None) -> np.ndarray:
    """`w` with each slice (tile) along `axis` signed so that its absmax element is positive:
    -absmax / scale = -(qmax + 0.5) is a rounding tie (-128 or -127, decided by the last bit of
    XLA's division), +absmax clips to qmax either way. Keeps the reference exact."""
    moved = np.moveaxis(w, axis, -1)
    tiles = moved.reshape(*moved.shape[:-1], -1, tile or moved.shape[-1])
    peak = np.take_along_axis(tiles, np.abs(tiles).argmax(-1)[..., None], -1)
    return np.moveaxis((tiles * np.sign(peak)).reshape(moved.shape), -1, axis)


def quantized(overrides, seed=0):
    cfg = make_cfg(overrides)
    return cfg, make_quantization(cfg.quantization, seed).apply(init_model(cfg.model, seed))


def with_kernels(cfg, fn):
    """The plain model with every projection kernel [in, out] replaced by fn(kernel)."""
    model = init_model(cfg.model, 0)
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if path[-1] == "kernel" and str(path[-2]).endswith("proj"):
            var.set_value(jnp.asarray(fn(np.asarray(var.get_value()))))
    return model


@pytest.mark.parametrize("qtype,tile", [("int8", None), ("int4", 16)])
def test_qat_weights_equal_a_numpy_fake_quantization(qtype, tile):
    """Weight-only QAT == the float model with NumPy fake-quantized kernels (per output channel,
    or per tile of the contraction dim), to 2e-5."""
    cfg = make_cfg(["quantization=int8_qat", "quantization.rules.0.act_qtype=null",
                    f"quantization.rules.0.weight_qtype={qtype}", f"quantization.rules.0.tile_size={tile or 'null'}"])
    float_model = with_kernels(cfg, lambda w: untied(w, 0, tile))
    x = tokens(shape=(2, 24))
    want = forward(with_kernels(cfg, lambda w: fake_quant(untied(w, 0, tile), qtype, axis=0, tile=tile)), x)
    model = make_quantization(cfg.quantization, 0).apply(float_model)
    np.testing.assert_allclose(np.asarray(forward(model, x)), np.asarray(want), atol=2e-5)
    drift = np.abs(np.asarray(forward(float_model, x)) - np.asarray(want)).max()
    assert drift > 1e-4  # the quantization is visible: the test can tell QAT from float


class OneLayer(nnx.Module):
    def __init__(self):
        self.proj = nnx.Linear(32, 16, use_bias=False, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return self.proj(x)


def test_qat_activations_are_fake_quantized_per_token():
    """W8A8 QAT of one projection == NumPy: x quantized per token over its contraction dim,
    W per output channel, then the float matmul (Qwix's dynamic activation scales)."""
    import qwix

    layer = OneLayer()
    rule = qwix.QtRule(module_path="proj", weight_qtype=jnp.int8, act_qtype=jnp.int8)
    x = untied(np.random.default_rng(0).normal(size=(2, 5, 32)).astype(np.float32), -1)
    layer.proj.kernel.set_value(jnp.asarray(untied(np.asarray(layer.proj.kernel.get_value()), 0)))
    qat = qwix.quantize_model(layer, qwix.QtProvider([rule]), jnp.asarray(x))
    w = np.asarray(layer.proj.kernel.get_value())
    want = fake_quant(x, "int8", axis=-1) @ fake_quant(w, "int8", axis=0)
    np.testing.assert_allclose(np.asarray(qat(jnp.asarray(x))), want, rtol=1e-5, atol=1e-5)


def test_unquantized_view_is_the_float_model():
    cfg, model = quantized(["quantization=int8_qat"])
    x = tokens()
    plain = np.asarray(unfuse(init_model(cfg.model, 0))(x))  # the form Qwix's model runs in (providers)
    assert np.abs(np.asarray(model(x)) - plain).max() > 1e-4
    np.testing.assert_array_equal(np.asarray(unquantized(model)(x)), plain)
    np.testing.assert_allclose(np.asarray(nnx.jit(lambda m, t: unquantized(m)(t))(model, x)), plain, atol=1e-6)


@pytest.mark.parametrize("option", ["lora", "qlora_nf4"])
def test_finalize_merges_adapters_into_the_base(option):
    """The merged plain model (W + alpha/rank * A B; QLoRA: dequantized W) computes what the
    adapted model computes."""
    from stack.checkpoint.saved_params import assign_params

    cfg = make_cfg([f"quantization={option}", "quantization.rules.0.tile_size=16", "quantization.rules.0.alpha=12.0",
                    "quantization.rules.0.rank=4"])
    quant = make_quantization(cfg.quantization, 0)
    adapted = quant.apply(init_model(cfg.model, 0))
    random_adapters(adapted)
    merged = init_model(cfg.model, 1)
    assign_params(merged, quant.finalize(adapted), "test")
    x = tokens()
    np.testing.assert_allclose(np.asarray(forward(merged, x)), np.asarray(forward(adapted, x)), atol=2e-5)
    base = init_model(cfg.model, 0)
    assert np.abs(np.asarray(forward(base, x)) - np.asarray(forward(adapted, x))).max() > 1e-3  # the adapters matter


@pytest.mark.parametrize("overrides,match", [
    (["quantization=int8_qat", "quantization.rules.0.module_path=.*qproj"],
     r"module_path'='\.\*qproj' matches no module.*layers/0/attn/q_proj.*layers/1/mlp/up_proj.*lm_head"),
    (["quantization=int4_qat"], r"tile_size'=64 does not divide layer layers/0/mlp/down_proj's contraction dim 176"),
    (["quantization=qlora_nf4"], r"tile_size'=64 does not divide layer layers/0/mlp/down_proj"),
    (["quantization=lora", "quantization.rules.0.module_path=.*qproj"], r"matches no module"),
])
def test_rules_are_checked_against_the_model_before_compute(overrides, match):
    with pytest.raises(ConfigError, match=match):
        quantized(overrides)


@pytest.mark.parametrize("overrides,match", [
    (["quantization=int8_qat", "quantization.rules.0.weight_qtype=int3"],
     r"'int3' for 'quantization.rules.0.weight_qtype'.*Available: fp8, int4, int8, nf4, null"),
    (["quantization=int8_qat", "quantization.rules.0.act_qtype=nf4"],
     r"'nf4' for 'quantization.rules.0.act_qtype'.*Available: fp8, int4, int8, null"),
    (["quantization=int8_qat", "quantization.rules.0.weight_qtype=null"], r"weight_qtype' is null for .*qat"),
    (["quantization=lora", "quantization.rules.0.act_qtype=int8"], r"act_qtype'='int8': LoRA/QLoRA"),
    (["quantization=int8_qat", "quantization.rules.0.act_calibration=median"],
     r"'median' for 'quantization.rules.0.act_calibration'.*Available: absmax, fixed, minmax, rms"),
    (["quantization=w8_ptq"], r"post-training quantization.*python -m stack.tools.quantize"),
    (["quantization=none", "quantization.method=fp4"], r"quantization.method.*Available: lora, none, ptq, qat"),
])
def test_bad_quantization_configs_name_the_key_and_the_choices(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(make_cfg(overrides))


@pytest.mark.parametrize("option,weight_bits", [("qlora_nf4", 4 + 32 / 16), ("none", None), ("int8_qat", None)])
def test_compile_footprint_counts_packed_codes_and_scales(option, weight_bits):
    """QLoRA NF4 with 16-weight tiles stores 4 bits + one float32 scale per 16 weights = 6 bits per
    quantized weight; the float comparison is the plain model's params (float32) and Adam's 2x."""
    from stack.engine.aot import abstract_run
    from stack.models.init import param_count
    from stack.quant.footprint import footprint
    from stack.run.build import build

    exp = build(make_cfg([f"quantization={option}", "quantization.rules.0.tile_size=16"] if option != "none"
                         else []), run_dir="", abstract=True)
    line = footprint(exp, abstract_run(exp).state)
    if weight_bits is None:  # QAT keeps float weights and trains them all: nothing saved
        assert line is None
        return
    n = param_count(exp.cfg.model)
    assert f"its quantized matrices {weight_bits:.2f} bits/weight (14)" in line
    mib = lambda b: f"{b / 2**20:.3g} MiB"  # noqa: E731
    assert f"without it (float float32, every param trained): {mib(4 * n)} and {mib(8 * n)}" in line
