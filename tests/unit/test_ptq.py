"""Post-training quantization (stack.quant.ptq, stack.tools.quantize): int8 weights keep the float
model's top-1 tokens, static activation scales are the calibration mean Qwix defines (checked in
NumPy), and a PTQ checkpoint reads back into the same model (and dequantizes for export)."""

import jax
import numpy as np
import pytest
from omegaconf import OmegaConf

from stack.errors import ConfigError
from stack.models.init import init_model
from stack.quant import ptq
from stack.tools.quantize import ptq_config, write_checkpoint
from tests.helpers import forward, make_cfg

QMAX_INT8 = 127.5  # Qwix's symmetric bound for int8: qmax + 0.5 (scale = absmax / 127.5)


def _setup(option: str, extra: tuple[str, ...] = ()):
    cfg = make_cfg(["model=llama_tiny", "model.d_ff=192", "data=synthetic", "data.batch_size=8",
                    f"quantization={option}", *extra])
    return cfg, init_model(cfg.model, 0)


def _batches(cfg, split: str, n: int):
    from stack.data.pipeline import Batches
    from stack.data.tokenizers import make_tokenizer

    return Batches(cfg.data, make_tokenizer(cfg.data.tokenizer), split, 1, cfg.data.batch_size).take(n)


def test_int8_weight_only_ptq_keeps_the_float_top1_token():
    cfg, model = _setup("w8_ptq")
    quantized = ptq.quantize(model, tuple(cfg.quantization.rules), [])
    r = ptq.compare(model, quantized, _batches(cfg, "eval", 2))
    assert r["top1_agreement"] >= 0.95, r
    assert 0 < r["mean_abs_logit_delta"] < 0.05, r  # quantized: not the float model itself
    assert abs(r["eval_loss_quantized"] - r["eval_loss_float"]) < 0.01, r
    assert ptq.weight_bytes(quantized) < 0.6 * ptq.weight_bytes(model)  # int8 projections, float embeddings


def _q_proj_input_absmax(model, batch) -> float:
    """NumPy: the mean over batch and tokens of each token's absmax of layer 0's q_proj input
    (RMSNorm of the embeddings), Qwix's static-range calibration with act_batch_axes (0, 1)."""
    x = np.asarray(model.embed.embedding.get_value())[batch["inputs"]].astype(np.float64)
    norm = model.layers[0].attn_norm
    w = np.asarray(norm.weight.get_value(), np.float64)
    h = x / np.sqrt((x * x).mean(-1, keepdims=True) + norm.eps) * w
    return float(np.abs(h).max(-1).mean())


def test_static_activation_scale_is_the_mean_calibration_of_the_batches():
    cfg, model = _setup("w8a8_ptq")
    rules = tuple(cfg.quantization.rules)
    batches = _batches(cfg, "train", 3)
    scales = ptq.activation_scales(ptq.quantize(model, rules, batches))
    key = "layers/0/attn/q_proj/dot_general0_lhs_scale"
    want = np.mean([_q_proj_input_absmax(model, b) for b in batches]) / QMAX_INT8
    np.testing.assert_allclose(scales[key], want, rtol=1e-5)
    other = ptq.activation_scales(ptq.quantize(model, rules, _batches(cfg, "eval", 1)))
    assert abs(other[key] - scales[key]) > 1e-4 * scales[key]  # calibration is not a no-op
    assert len(scales) == 2 * 7  # every projection of both layers


@pytest.mark.parametrize("option", ["w8_ptq", "nf4_ptq"])  # nf4 codes: uint4, stored as uint8
def test_a_ptq_checkpoint_reads_back_and_dequantizes_for_export(tmp_path, option):
    from stack.checkpoint.policy import float_policy, load_policy

    cfg, model = _setup(option)
    quantized = ptq.quantize(model, tuple(cfg.quantization.rules), [])
    write_checkpoint(str(tmp_path), cfg, quantized, 7, {"note": "test"})
    loaded, run, saved = load_policy(str(tmp_path / "checkpoints"))
    assert saved.step == 7 and saved.quantized and run.quantization.name == option
    tokens = np.asarray(_batches(cfg, "eval", 1)[0]["inputs"])
    np.testing.assert_array_equal(np.asarray(forward(loaded, tokens)), np.asarray(forward(quantized, tokens)))
    plain, _, _ = float_policy(str(tmp_path / "checkpoints"))
    assert type(plain).__name__ == "Llama" and not hasattr(type(plain), "_unquantized_type")
    np.testing.assert_allclose(np.asarray(forward(plain, tokens)), np.asarray(forward(quantized, tokens)), atol=2e-5)
    # the quantized weights, not float
    assert float(jax.numpy.abs(forward(plain, tokens) - forward(model, tokens)).max()) > 1e-4


@pytest.mark.parametrize("overrides, match", [
    (["quantization=int8_qat"], r"not post-training quantization: name one of w8_ptq"),
    (["quantization=w8_ptq", "data=jsonl_prompts"], r"data.kind='prompt'.*no target tokens"),
    (["quantization=w8_ptq", "quantization.calibration_batches=0"], r"calibration_batches'=0 must be >= 1"),
])
def test_bad_ptq_configs_are_one_paragraph(overrides, match):
    run = OmegaConf.create(OmegaConf.to_container(make_cfg(["+recipe=llama_sft"]), resolve=True))
    with pytest.raises(ConfigError, match=match):
        ptq_config(run, overrides)


def test_overrides_replace_a_group_whole_and_a_key_alone():
    run = OmegaConf.create(OmegaConf.to_container(make_cfg(["+recipe=llama_sft", "data.seq_len=96"]), resolve=True))
    cfg = ptq_config(run, ["quantization=w4_ptq", "quantization.rules.0.tile_size=16", "trainer.eval_batches=3"])
    assert cfg.quantization.name == "w4_ptq" and cfg.quantization.rules[0].tile_size == 16
    assert cfg.trainer.eval_batches == 3 and cfg.data.seq_len == 96 and cfg.data.name == run.data.name


def test_a_dpo_runs_shared_prompt_rows_are_read_whole_for_calibration():
    """llama_dpo lays pairs out as shared-prompt rows; PTQ calibrates and measures on whole rows."""
    run = OmegaConf.create(OmegaConf.to_container(make_cfg(["+recipe=llama_dpo"]), resolve=True))
    assert run.data.share_prompt and run.data.max_completion_len == 8
    cfg = ptq_config(run, ["quantization=w8_ptq"])
    assert not cfg.data.share_prompt and cfg.data.max_completion_len is None
    batch = ptq.rows(_batches(cfg, "eval", 1)[0])
    assert batch["targets"].shape == (2 * cfg.data.batch_size, cfg.data.seq_len) and "loss_mask" in batch
