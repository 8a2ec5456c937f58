"""`model=hf model.path=DIR` takes the architecture from config.json; rope scaling is a typed,
command-line-settable field whose math is transformers' llama3 rope init."""

import jax.numpy as jnp
import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="HF interop tests need transformers")
torch = pytest.importorskip("torch", reason="HF interop tests need torch (CPU)")

from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

from stack.checkpoint.policy import initial_model  # noqa: E402
from stack.config.hf_config import take_architecture  # noqa: E402
from stack.config.validate import validate  # noqa: E402
from stack.errors import ConfigError  # noqa: E402
from stack.models.rope import rope_inv_freq  # noqa: E402
from tests.helpers import make_cfg  # noqa: E402

# Llama 3.1 style: llama3 rope scaling with a short original context, so positions past it matter
ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16, "rope_theta": 500000.0}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny Llama-3.1-style checkpoint written by transformers: tied, head_dim != d/heads, GQA."""
    cfg = transformers.LlamaConfig(
        vocab_size=384, hidden_size=32, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-6,
        rope_parameters=dict(ROPE), tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("hf")
    model.save_pretrained(path)
    return str(path), model


def composed(overrides: list[str]):
    cfg = make_cfg(overrides)
    take_architecture(cfg, overrides)
    validate(cfg)
    return cfg


def test_model_hf_takes_the_architecture_and_matches_transformers(hf_dir):
    path, hf = hf_dir
    cfg = composed(["model=hf", f"model.path={path}"])
    m = cfg.model
    assert (m.vocab_size, m.d_model, m.n_layers, m.n_heads, m.n_kv_heads, m.head_dim, m.d_ff) == (
        384, 32, 2, 4, 2, 16, 72)
    assert (m.rope_theta, m.norm_eps, m.tie_embeddings, m.max_seq_len, m.param_dtype) == (
        500000.0, 1e-6, True, 128, "float32")
    assert dict(m.rope_scaling) == {
        "type": "llama3", **{k: v for k, v in ROPE.items() if k not in ("rope_type", "rope_theta")}}
    assert m.init_from == f"hf:{path}"
    model = initial_model(cfg)
    ids = np.random.default_rng(0).integers(0, 384, size=(2, 40))  # past the original 16 positions
    with torch.no_grad():
        want = hf(torch.from_numpy(ids)).logits.numpy()
    got = np.asarray(model(jnp.asarray(ids, jnp.int32)))
    assert np.abs(want).max() > 0.05
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_explicit_overrides_must_agree_with_the_file(hf_dir):
    path, _ = hf_dir
    assert composed(["model=hf", f"model.path={path}", "model.d_ff=72"]).model.d_ff == 72  # agrees: fine
    with pytest.raises(ConfigError) as err:
        composed(["model=hf", f"model.path={path}", "model.n_kv_heads=4", "model.rope_scaling.factor=4.0"])
    rows = {line.split()[0]: line.split()[1:] for line in str(err.value).splitlines()[2:-1]}
    assert set(rows) == {"model.n_kv_heads", "model.rope_scaling"}
    assert rows["model.n_kv_heads"] == ["4", "num_key_value_heads=2"]
    with pytest.raises(ConfigError, match="'model.path' is required"):
        composed(["model=hf"])


@pytest.mark.parametrize("factor,low,high,original,theta", [(8.0, 1.0, 4.0, 8192, 500000.0),
                                                            (32.0, 1.0, 4.0, 8192, 500000.0),
                                                            (4.0, 2.0, 8.0, 64, 10000.0)])
def test_rope_scaling_from_the_command_line_is_transformers_llama3_init(factor, low, high, original, theta):
    cfg = composed([f"model.rope_scaling={{type:llama3,factor:{factor},low_freq_factor:{low},high_freq_factor:{high},"
                    f"original_max_position_embeddings:{original}}}", f"model.rope_theta={theta}",
                    "model.head_dim=128"])
    got = rope_inv_freq(128, cfg.model.rope_theta, cfg.model.rope_scaling)
    hf = transformers.LlamaConfig(hidden_size=512, num_attention_heads=4, head_dim=128, rope_parameters={
        "rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": low,
        "high_freq_factor": high, "original_max_position_embeddings": original})
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)
    assert not np.allclose(got, rope_inv_freq(128, theta))  # the scaling did something


def test_rope_scaling_keys_are_typed_and_checked():
    assert make_cfg(["model.rope_scaling.type=llama3"]).model.rope_scaling.factor == 8.0
    with pytest.raises(ConfigError, match="Unknown value 'yarn' for 'model.rope_scaling.type'"):
        validate(make_cfg(["model.rope_scaling.type=yarn"]))
    with pytest.raises(ConfigError, match="not a valid llama3 scaling"):
        validate(make_cfg(["model.rope_scaling={type:llama3,low_freq_factor:5.0}"]))


def test_dpo_reference_from_a_hugging_face_dir(hf_dir):
    from stack.algorithms.base import Context
    from stack.algorithms.dpo import DPO
    from stack.models.init import init_model
    from stack.quant.providers import NoQuantization

    path, hf = hf_dir
    cfg = composed(["model=hf", f"model.path={path}", "algorithm=dpo", "data=jsonl_prefs",
                    f"algorithm.reference.init_from=hf:{path}"])
    policy = init_model(cfg.model, 1)  # not the HF weights: the reference must come from the dir
    own = np.asarray(policy.embed.embedding[...])
    ctx = Context(NoQuantization(), model=cfg.model)
    reference = DPO(reference=dict(cfg.algorithm.reference)).setup(policy, ctx).frozen["reference"]
    ids = np.random.default_rng(1).integers(0, 384, size=(1, 24))
    with torch.no_grad():
        want = hf(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(reference(jnp.asarray(ids, jnp.int32))), want, atol=1e-4, rtol=1e-4)
    np.testing.assert_array_equal(np.asarray(policy.embed.embedding[...]), own)  # the policy is untouched
    other = composed(["algorithm=dpo", "data=jsonl_prefs"]).model  # llama_tiny: not the dir's shapes
    with pytest.raises(ConfigError, match=r"disagrees with the Hugging Face checkpoint's config.json"):
        DPO(reference={"init_from": f"hf:{path}"}).setup(init_model(other, 0), Context(NoQuantization(), model=other))


def test_model_hf_uses_the_dirs_tokenizer_with_its_config_ids(hf_dir, tmp_path):
    import json
    import shutil

    from tokenizers import Tokenizer, models

    from stack.data.tokenizers import make_tokenizer, stop_ids

    path = tmp_path / "instruct"
    shutil.copytree(hf_dir[0], path)
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<|eot_id|>", "a", "b"])}
    Tokenizer(models.WordLevel(vocab, unk_token="a")).save(str(path / "tokenizer.json"))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "bos_token_id": 1, "eos_token_id": [3, 2]}))
    (path / "generation_config.json").unlink(missing_ok=True)  # save_pretrained's, with the old ids
    cfg = composed(["model=hf", f"model.path={path}"])
    assert cfg.data.tokenizer == str(path)  # data.tokenizer=byte (the default) gives way to the dir's
    tok = make_tokenizer(cfg.data.tokenizer)
    assert (tok.bos_id, tok.eos_id) == (1, 3)  # config.json's ids (by name alone eos would be </s> = 2)
    assert stop_ids(tok) == (3, 2)  # generation stops at either (it stopped at the first alone, issue 81)
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2, 3]}))
    assert stop_ids(make_tokenizer(str(path))) == (2, 3)  # generation_config.json wins, as in transformers
    assert composed(["model=hf", f"model.path={hf_dir[0]}"]).data.tokenizer == "byte"  # no tokenizer there
