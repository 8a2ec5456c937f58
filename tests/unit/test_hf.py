"""HF Llama interop against the reference: transformers' LlamaForCausalLM (torch, CPU, fp32)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

transformers = pytest.importorskip("transformers", reason="HF interop tests need transformers")
torch = pytest.importorskip("torch", reason="HF interop tests need torch (CPU)")

from safetensors.numpy import load_file, save_file  # noqa: E402

from stack.config.hf_config import check_config, hf_config_to_model  # noqa: E402
from stack.config.schema.model import ModelConfig, RopeScalingConfig  # noqa: E402
from stack.errors import ConfigError  # noqa: E402
from stack.models.hf import export_hf, load_hf_weights  # noqa: E402
from stack.models.init import abstract_model  # noqa: E402
from tests.helpers import fake_devices, forward  # noqa: E402

SEQ = 48
SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 16}


def hf_model(tie: bool = False, rope_scaling: dict | None = None):
    """A tiny random fp32 LlamaForCausalLM (GQA) whose every weight, norms included, is O(1)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=80, max_position_embeddings=256, rms_norm_eps=1e-5,
        rope_theta=10000.0, rope_scaling=dict(rope_scaling) if rope_scaling else None,  # it edits the dict
        tie_word_embeddings=tie)
    model = transformers.LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if p.ndim == 1 else torch.randn_like(p) / p.shape[1] ** 0.5)
    return model


def our_cfg(tie: bool = False, rope_scaling: dict | None = None, **kw) -> ModelConfig:
    scaling = RopeScalingConfig() if rope_scaling is None else RopeScalingConfig(
        type="llama3", **{k: v for k, v in rope_scaling.items() if k != "rope_type"})
    base = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=80,
                rope_theta=10000.0, rope_scaling=scaling, max_seq_len=256, norm_eps=1e-5,
                tie_embeddings=tie)
    return ModelConfig(**{**base, **kw})


def tokens(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 97, size=(2, SEQ), dtype=np.int32)


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()


def max_diff(model, hf, ids) -> float:
    return float(np.abs(np.asarray(forward(model, jnp.asarray(ids))) - hf_logits(hf, ids)).max())


@pytest.mark.parametrize("case", ["gqa", "tied", "llama3_rope", "sharded"])
def test_load_matches_transformers(case, tmp_path):
    tie, scaling = case == "tied", SCALING if case == "llama3_rope" else None
    hf = hf_model(tie, scaling)
    hf.save_pretrained(tmp_path, safe_serialization=True,
                       **({"max_shard_size": "20KB"} if case == "sharded" else {}))
    if case == "sharded":
        with open(tmp_path / "model.safetensors.index.json") as f:
            assert len(set(json.load(f)["weight_map"].values())) > 2
    cfg = our_cfg(tie, scaling)
    model = abstract_model(cfg)  # the loader fills a shape-only model too
    load_hf_weights(model, cfg, f"hf:{tmp_path}")
    ids = tokens()
    assert max_diff(model, hf, ids) < 1e-4
    if case == "llama3_rope":  # positions past original_max_position_embeddings: scaling matters
        plain = abstract_model(our_cfg())
        nnx.update(plain, nnx.state(model, nnx.Param))
        assert max_diff(plain, hf, ids) > 1e-2


MESH_WORKER = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from stack.models.hf import load_hf_weights
from stack.models.init import abstract_model, init_model
from stack.config.schema.model import ModelConfig
cfg = ModelConfig(**json.loads(sys.argv[2]))
mesh = jax.make_mesh((2, 2), ("fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
rules = (("vocab", None), ("embed", "fsdp"), ("heads", "tensor"), ("kv_heads", "tensor"),
         ("head_dim", None), ("mlp", "tensor"), ("norm", None))
out = []
with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    for model in (init_model(cfg, 0), abstract_model(cfg)):
        specs = lambda: [str(v.get_value().sharding.spec) for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param))]
        before = specs()
        load_hf_weights(model, cfg, sys.argv[1])
        assert specs() == before and "P('fsdp', 'tensor')" in before, (before, specs())
        out.append(np.asarray(nnx.jit(lambda m, t: m(t))(model, jnp.asarray(json.loads(sys.argv[3])))).tolist())
print(json.dumps(out))
"""


def test_load_keeps_mesh_sharding(tmp_path):
    """On a 2x2 CPU mesh, into an initialised and an abstract model: same layout, HF's logits."""
    hf = hf_model()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    cfg, ids = our_cfg(), tokens()[:, :8]
    fields = {k: getattr(cfg, k) for k in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
                                           "d_ff", "max_seq_len", "norm_eps")}
    env = {**fake_devices(4), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", MESH_WORKER, str(tmp_path), json.dumps(fields),
                           json.dumps(ids.tolist())], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for logits in json.loads(proc.stdout.splitlines()[-1]):
        assert np.abs(np.asarray(logits) - hf_logits(hf, ids)).max() < 1e-4


def randomized(cfg, seed: int = 0):
    """Our model with O(1) random weights (norms around 1)."""
    model = abstract_model(cfg)
    rng = np.random.default_rng(seed)

    def draw(x):
        w = 1 + 0.3 * rng.normal(size=x.shape) if x.ndim == 1 else rng.normal(size=x.shape) / np.sqrt(x.shape[0])
        return jnp.asarray(w, x.dtype)

    nnx.update(model, jax.tree.map(draw, nnx.state(model, nnx.Param)))
    return model


@pytest.mark.parametrize("tie,scaling,dtype", [(False, None, "float32"), (True, SCALING, "bfloat16")])
def test_export_loads_in_transformers(tie, scaling, dtype, tmp_path):
    cfg = our_cfg(tie, scaling)
    model = randomized(cfg)
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "notes.txt"):
        (tok_dir / name).write_text(f"content of {name}")
    out = tmp_path / "out"
    export_hf(model, cfg, str(out), tokenizer_dir=str(tok_dir), dtype=dtype)
    assert (out / "tokenizer.json").read_text() == "content of tokenizer.json"
    assert (out / "tokenizer_config.json").exists() and not (out / "notes.txt").exists()
    with open(out / "config.json") as f:
        check_config(json.load(f), cfg)
    hf = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    if dtype == "bfloat16":  # compare with our weights rounded the same way
        nnx.update(model, jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(x.dtype), nnx.state(model, nnx.Param)))
    assert max_diff(model, hf, tokens(1)) < 1e-4
    back = randomized(cfg, 5)  # and our loader reads the export (bf16 included) exactly
    load_hf_weights(back, cfg, str(out))
    for a, b in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), jax.tree.leaves(nnx.state(back, nnx.Param)),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_config_both_transformers_styles():
    old = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256,
           "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "rope_theta": 500000.0,
           "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
           "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    llama = {"family": None, "attention_bias": False, "qk_norm": False, "sliding_window": None, "layer_types": None,
             "rope_local_theta": None, "query_pre_attn_scalar": None, "final_logit_softcapping": None,
             "hidden_act": None, "num_experts": None, "num_experts_per_tok": None, "moe_d_ff": None,
             "norm_topk_prob": False}  # the family keys: all off
    want = {"vocab_size": 128256, "d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8,
            "head_dim": None, "d_ff": 14336, "rope_theta": 500000.0, "max_seq_len": 131072,
            "norm_eps": 1e-5, "tie_embeddings": False, **llama,
            "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    assert hf_config_to_model(old) == want
    new = {k: v for k, v in old.items() if k not in ("rope_theta", "rope_scaling")}
    new["rope_parameters"] = {**old["rope_scaling"], "rope_type": "llama3", "rope_theta": 500000.0}
    del new["rope_parameters"]["type"]
    assert hf_config_to_model(new) == want
    new["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    assert hf_config_to_model(new) | {"rope_theta": 500000.0} == want | {"rope_scaling": {"type": "default"}}


@pytest.fixture
def saved(tmp_path):
    hf_model().save_pretrained(tmp_path, safe_serialization=True)
    return tmp_path


def test_config_mismatch_names_every_key(saved):
    cfg = our_cfg(n_layers=3, d_ff=96)
    with pytest.raises(ConfigError) as err:
        load_hf_weights(abstract_model(cfg), cfg, str(saved))
    msg = str(err.value)
    rows = {line.split()[0]: line.split()[1:] for line in msg.splitlines()[2:-1]}
    assert rows == {"model.n_layers": ["3", "num_hidden_layers=2"], "model.d_ff": ["96", "intermediate_size=80"]}


def test_rejects_other_models(saved):
    with open(saved / "config.json") as f:
        hf = json.load(f)
    with pytest.raises(ConfigError, match="model_type='phi3'.*stack reads a causal LM of model_type llama, qwen2"):
        check_config({**hf, "model_type": "phi3", "architectures": ["Phi3ForCausalLM"]}, our_cfg())
    with pytest.raises(ConfigError, match="model.family +None +model_type=mistral"):  # a Mistral read as a Llama
        check_config({**hf, "model_type": "mistral", "architectures": ["MistralForCausalLM"]}, our_cfg())


def edit_tensors(path, edit) -> None:
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


def test_missing_tensor(saved):
    edit_tensors(saved, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    cfg = our_cfg()
    with pytest.raises(ConfigError, match=r"lacks tensors \['model.layers.1.mlp.up_proj.weight'\]"):
        load_hf_weights(abstract_model(cfg), cfg, str(saved))


def test_wrong_shape(saved):
    edit_tensors(saved, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": np.zeros((8, 32), np.float32)}))
    cfg = our_cfg()
    want = r"model.layers.0.self_attn.k_proj.weight: expected \(16, 32\), got \(8, 32\)"
    with pytest.raises(ConfigError, match=want):
        load_hf_weights(abstract_model(cfg), cfg, str(saved))
