"""The decoder families against transformers (torch, CPU, fp32, eager attention): a tiny random
Qwen2, Qwen3, Mistral, Gemma 3, Qwen3-MoE and Mixtral saved by transformers, read by `model=hf`'s path (config.json ->
the model group, the weights), gives transformers' logits on a batch of two rows, one left-padded,
longer than the sliding window; `export_hf` writes a directory transformers loads to the same
logits. The KV-cache decode of each equals a recompute; the experts' load-balancing loss equals
transformers'."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

transformers = pytest.importorskip("transformers", reason="HF interop tests need transformers")
torch = pytest.importorskip("torch", reason="HF interop tests need torch (CPU)")

from stack.config.hf_config import check_config, hf_model_config, read_config  # noqa: E402
from stack.models.hf import export_hf, load_hf_weights  # noqa: E402
from stack.models.init import abstract_model  # noqa: E402
from stack.models.kv_cache import init_cache  # noqa: E402
from stack.models.llama import unfuse  # noqa: E402
from stack.models.moe import record_router, router_aux_loss  # noqa: E402
from tests.helpers import forward  # noqa: E402

SEQ, PAD, VOCAB = 24, 5, 97
BASE = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=64, max_position_embeddings=256, rms_norm_eps=1e-6)
FAMILIES = {
    "qwen2": lambda: transformers.Qwen2Config(**BASE, tie_word_embeddings=True),
    "qwen3": lambda: transformers.Qwen3Config(**BASE, head_dim=16, rope_parameters={"rope_type": "default",
                                                                                   "rope_theta": 1e6}),
    "qwen3_sliding": lambda: transformers.Qwen3Config(**BASE, head_dim=8, use_sliding_window=True, sliding_window=6,
                                                      max_window_layers=1),
    "mistral": lambda: transformers.MistralConfig(**BASE, head_dim=8, sliding_window=7),
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **BASE, head_dim=8, sliding_window=6, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        query_pre_attn_scalar=12, final_logit_softcapping=3.0,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**BASE, head_dim=8, num_experts=6, num_experts_per_tok=2,
                                                     moe_intermediate_size=16, norm_topk_prob=True),
    "qwen3_moe_unnormed": lambda: transformers.Qwen3MoeConfig(**BASE, head_dim=8, num_experts=4, num_experts_per_tok=3,
                                                              moe_intermediate_size=16, norm_topk_prob=False),
    "mixtral": lambda: transformers.MixtralConfig(**{**BASE, "intermediate_size": 16}, num_local_experts=4,
                                                  num_experts_per_tok=2, sliding_window=7),
}


def hf_model(name: str):
    """A tiny random fp32 model of the family with O(1) weights (norm weights and biases too)."""
    torch.manual_seed(0)
    config = FAMILIES[name]()
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if p.ndim == 1 else torch.randn_like(p) / p.shape[1] ** 0.5)
    return model


def batch():
    """Two rows of SEQ tokens, the second left-padded by PAD (its positions start at 0 after them)."""
    ids = np.random.default_rng(0).integers(1, VOCAB, size=(2, SEQ)).astype(np.int32)
    mask = np.ones((2, SEQ), np.int32)
    mask[1, :PAD] = 0
    ids[1, :PAD] = 0
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0).astype(np.int32)
    return ids, mask, positions


def hf_logits(model, ids, mask, positions) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids.astype(np.int64)), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                     position_ids=torch.from_numpy(positions.astype(np.int64))).logits.numpy()


def ours(model, ids, mask, positions) -> np.ndarray:
    return np.asarray(forward(model, jnp.asarray(ids), jnp.asarray(positions), jnp.asarray(mask)))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_load_and_export_match_transformers(name, tmp_path):
    hf = hf_model(name)
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    cfg = hf_model_config(str(tmp_path / "hf"))
    model = abstract_model(cfg)
    load_hf_weights(model, cfg, f"hf:{tmp_path / 'hf'}")
    ids, mask, positions = batch()
    want, got = hf_logits(hf, ids, mask, positions), ours(model, ids, mask, positions)
    real = mask.astype(bool)
    assert np.abs(got - want)[real].max() < 1e-4, name
    export_hf(model, cfg, str(tmp_path / "out"))
    check_config(read_config(str(tmp_path / "out")), cfg)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    assert type(again) is type(hf)
    assert np.abs(hf_logits(again, ids, mask, positions) - want)[real].max() < 1e-5, name


def test_the_window_and_the_families_differences_matter():
    """Without the sliding window (Mistral) or Gemma's soft-capping the logits differ: the test above can fail."""
    ids, mask, positions = batch()
    for name, key in (("mistral", "sliding_window"), ("gemma3", "final_logit_softcapping")):
        hf = hf_model(name)
        hf.save_pretrained(f"/tmp/stack_family_{name}", safe_serialization=True)
        cfg = hf_model_config(f"/tmp/stack_family_{name}")
        model = abstract_model(cfg)
        load_hf_weights(model, cfg, f"hf:/tmp/stack_family_{name}")
        cfg[key] = None
        other = abstract_model(cfg)
        nnx.update(other, nnx.state(model, nnx.Param))
        assert np.abs(ours(other, ids, mask, positions) - hf_logits(hf, ids, mask, positions)).max() > 1e-2, name


@pytest.mark.parametrize("name", ["gemma3", "mistral", "qwen3_sliding", "mixtral"])
def test_cached_decode_equals_the_recompute(name, tmp_path):
    """Prefill the padded prompts, then decode token by token through the cache: each step's logits
    equal the whole sequence's forward (sliding windows across the cache, soft-capped logits), both
    through the einsum attention (`unfuse`: the fused core sums in another order, 1.2e-5 apart here)."""
    hf = hf_model(name)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    cfg = hf_model_config(str(tmp_path))
    model = abstract_model(cfg)
    load_hf_weights(model, cfg, f"hf:{tmp_path}")
    ids, mask, positions = batch()
    prompt, steps = 10, SEQ - 10
    cache = init_cache(model, 2, SEQ)
    call = nnx.jit(lambda m, t, p, s, c: m(t, p, s, cache=c))
    logits, cache = call(model, jnp.asarray(ids[:, :prompt]), jnp.asarray(positions[:, :prompt]),
                         jnp.asarray(mask[:, :prompt]), cache)
    decoded = [np.asarray(logits)]
    for i in range(prompt, prompt + steps):
        logits, cache = call(model, jnp.asarray(ids[:, i:i + 1]), jnp.asarray(positions[:, i:i + 1]),
                             jnp.asarray(mask[:, i:i + 1]), cache)
        decoded.append(np.asarray(logits))
    whole = ours(unfuse(model), ids, mask, positions)
    real = mask.astype(bool)
    assert np.abs(np.concatenate(decoded, 1) - whole)[real].max() < 1e-5, name
    assert jax.tree.leaves(cache)  # the cache came back


@pytest.mark.parametrize("scan", [False, True])
def test_the_load_balancing_loss_equals_transformers(scan, tmp_path):
    """transformers' load_balancing_loss_func over every layer's router logits, padding left out by the
    attention mask, as the MoE layers sow it (record on) unrolled and in one scan over the layers."""
    hf = hf_model("qwen3_moe")
    hf.save_pretrained(tmp_path, safe_serialization=True)
    cfg = hf_model_config(str(tmp_path))
    cfg.scan_layers = scan
    model = abstract_model(cfg)
    load_hf_weights(model, cfg, f"hf:{tmp_path}")
    ids, mask, positions = batch()
    with torch.no_grad():
        want = hf(torch.from_numpy(ids.astype(np.int64)), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                  position_ids=torch.from_numpy(positions.astype(np.int64)), output_router_logits=True).aux_loss
    record_router(model)
    ours(model, ids, mask, positions)
    got = router_aux_loss(model)
    assert abs(float(got) - float(want)) < 1e-5 and float(want) > 1.0
    assert router_aux_loss(model) is None  # popped: nothing left
