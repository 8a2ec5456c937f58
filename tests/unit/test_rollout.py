"""Generation with the KV cache against full recomputation, and the sampling filters against NumPy."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stack.models.init import init_model
from stack.models.kv_cache import init_cache
from stack.rollout import Sampling, filter_logits, generate, sample_keys, sample_token
from tests.helpers import make_cfg

CFG = make_cfg([]).model  # llama_tiny: GQA (4 heads, 2 kv heads), untied


@pytest.fixture(scope="module")
def model():
    return init_model(CFG, 0)


def left_padded(prompts: list[list[int]], pad: int = 0) -> tuple[np.ndarray, np.ndarray]:
    width = max(map(len, prompts))
    ids = np.array([[pad] * (width - len(p)) + p for p in prompts], np.int32)
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts], np.int32)
    return ids, mask


def recompute(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Full forward of the whole (left-padded) sequences, positions = cumsum(mask) - 1."""
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    return np.asarray(nnx.jit(lambda m, i, p, s: m(i, p, segment_ids=s))(model, ids, positions, mask))


PROMPTS = [[5, 9, 33, 41, 7], [12, 3], [100, 200, 7]]


def test_cached_decode_logits_equal_full_recompute_at_every_step(model):
    ids, mask = left_padded(PROMPTS)
    b, p = ids.shape
    cache = init_cache(model, b, p + 6)
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    step = nnx.jit(lambda m, t, pos, seg, c: m(t, pos, segment_ids=seg, cache=c))
    logits, cache = step(model, ids, positions, mask, cache)
    seq, seq_mask, lengths = ids, mask, mask.sum(-1)
    for t in range(6):
        full = recompute(model, seq, seq_mask)[:, -1]
        np.testing.assert_allclose(np.asarray(logits[:, -1]), full, atol=1e-5, rtol=0)
        token = np.argmax(full, -1).astype(np.int32)[:, None]  # greedy = argmax of the recompute
        seq, seq_mask = np.concatenate([seq, token], 1), np.concatenate([seq_mask, np.ones((b, 1), np.int32)], 1)
        logits, cache = step(model, token, (lengths + t)[:, None], np.ones((b, 1), np.int32), cache)


def run(model, prompts, keys, **sampling):
    ids, mask = left_padded(prompts)
    s = Sampling(**{"max_new_tokens": 8, "eos_ids": (2,), **sampling})
    out = nnx.jit(lambda m, i, k, key: generate(m, i, k, key, s))(model, ids, mask, keys)
    return jax.tree.map(np.asarray, out)


def keys_for(n: int, seed: int = 0, offset: int = 0):
    return sample_keys(jax.random.key(seed), jnp.arange(offset, offset + n), jnp.zeros(n, jnp.int32))


def test_greedy_generation_is_the_argmax_of_recomputation(model):
    out = run(model, PROMPTS, keys_for(3), temperature=0.0)
    ids, mask = left_padded(PROMPTS)
    for t in range(8):
        full = recompute(model, ids, mask)[:, -1]
        alive = out.mask[:, t] == 1
        np.testing.assert_array_equal(out.tokens[alive, t], np.argmax(full, -1)[alive])
        ids = np.concatenate([ids, out.tokens[:, t:t + 1]], 1)
        mask = np.concatenate([mask, np.ones((3, 1), np.int32)], 1)
    assert np.isfinite(out.logps).all()


def test_a_tiny_temperature_is_greedy_and_keys_decide_the_samples(model):
    greedy = run(model, PROMPTS, keys_for(3), temperature=0.0)
    cold = run(model, PROMPTS, keys_for(3), temperature=1e-6)
    np.testing.assert_array_equal(cold.tokens, greedy.tokens)
    a, b = run(model, PROMPTS, keys_for(3, seed=1)), run(model, PROMPTS, keys_for(3, seed=1))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logps, b.logps)
    c = run(model, PROMPTS, keys_for(3, seed=2))
    assert (a.tokens != c.tokens).any()


def test_a_left_padded_batch_gives_each_prompt_its_own_completion(model):
    batch = run(model, PROMPTS, keys_for(3))
    for i, prompt in enumerate(PROMPTS):
        alone = run(model, [prompt], keys_for(1, offset=i))  # the same per-sample key, alone
        np.testing.assert_array_equal(alone.tokens[0], batch.tokens[i])
        np.testing.assert_allclose(alone.logps[0], batch.logps[i], atol=1e-5)


class Script:
    """A stand-in model: row b's next token is rows[b][k] after its k-th generated token."""

    dtype = jnp.float32
    layers = [SimpleNamespace(attn=SimpleNamespace(n_kv_heads=1, head_dim=2))]

    def __init__(self, rows: list[list[int]], prompt: int):
        self.rows, self.prompt = jnp.asarray(rows), prompt

    def __call__(self, tokens, positions, segment_ids=None, cache=None):
        k = jnp.clip(cache.index + tokens.shape[1] - self.prompt, 0, self.rows.shape[1] - 1)
        logits = jax.nn.one_hot(self.rows[:, k], 16)[:, None] * 100.0
        return jnp.repeat(logits, tokens.shape[1], 1), cache._replace(index=cache.index + tokens.shape[1])


def test_completion_mask_includes_the_eos_and_truncation_is_flagged():
    model = Script([[7, 2, 9, 9, 9], [7, 8, 9, 9, 9]], prompt=5)  # row 0 emits eos 2 second; row 1 never
    ids, mask = left_padded([[3, 4, 5, 6, 7], [3, 4, 5, 6, 7]])
    out = generate(model, jnp.asarray(ids), jnp.asarray(mask), keys_for(2),
                   Sampling(max_new_tokens=4, temperature=0.0, eos_ids=(2, 11), pad_id=0))
    assert np.asarray(out.tokens).tolist() == [[7, 2, 0, 0], [7, 8, 9, 9]]
    assert np.asarray(out.mask).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert np.asarray(out.truncated).tolist() == [False, True]


def numpy_filter(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """HF's warpers in order, written independently: temperature, top-k, top-p (on a sort)."""
    out = logits.astype(np.float64) / temperature
    for row in out:
        if top_k:
            row[row < np.sort(row)[::-1][top_k - 1]] = -np.inf
        if top_p < 1:
            order = np.argsort(-row, kind="stable")
            probs = np.exp(row[order] - row[order][0])
            probs /= probs.sum()
            cut = np.searchsorted(np.cumsum(probs), top_p, side="left") + 1  # tokens to keep
            row[order[cut:]] = -np.inf
    return out


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 5, 1.0), (0.7, 0, 0.8), (1.3, 20, 0.6), (1.0, 0, 0.95)])
def test_filters_keep_the_tokens_numpy_keeps(temperature, top_k, top_p):
    logits = np.random.default_rng(0).normal(scale=2.0, size=(6, 50)).astype(np.float32)
    got = np.asarray(filter_logits(jnp.asarray(logits), temperature, top_k, top_p))
    want = numpy_filter(logits, temperature, top_k, top_p)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    np.testing.assert_allclose(got[np.isfinite(got)], want[np.isfinite(want)], rtol=1e-6)


def test_sampling_frequencies_follow_the_filtered_distribution_and_log_probs_the_tempered_one():
    logits = jnp.asarray([[2.0, 1.0, 0.5, -1.0, -3.0]])
    s = Sampling(max_new_tokens=1, temperature=0.8, top_k=3)
    keys = jax.random.split(jax.random.key(0), 20000)
    tokens, logps = jax.vmap(lambda k: sample_token(logits, k[None], s))(keys)
    counts = np.bincount(np.asarray(tokens).ravel(), minlength=5) / 20000
    probs = np.exp(np.asarray(filter_logits(logits, 0.8, 3))[0])
    probs /= probs.sum()
    np.testing.assert_allclose(counts, probs, atol=0.01)
    assert counts[3] == counts[4] == 0
    # the log-prob is the tempered, unfiltered one the training forward computes (TRL: filters sample only)
    tempered = np.exp(np.asarray(logits, np.float64)[0] / 0.8)
    tempered /= tempered.sum()
    np.testing.assert_allclose(np.exp(np.asarray(logps).ravel()), tempered[np.asarray(tokens).ravel()], rtol=1e-5)


@pytest.mark.parametrize("flag", ["--top-k=-1", "--top-p=0", "--top-p=1.5", "--temperature=-0.5", "--num-samples=0"])
def test_the_sampling_cli_refuses_out_of_range_flags_before_loading_anything(flag, capsys):
    from stack.tools.generate import main

    with pytest.raises(SystemExit) as info:
        main(["no/such/checkpoints", "--prompt", "1+1=", flag])
    err = capsys.readouterr().err
    assert info.value.code == 2 and flag in err and "--top-p in (0, 1]" in err, err


@pytest.mark.parametrize("template,turn", [
    ("chatml", "<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n"),  # the ChatML format
    ("llama3", "<|start_header_id|>user<|end_header_id|>\n\n{p}<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n"),
])
def test_chat_prompts_are_a_user_turn_with_an_open_assistant_turn(template, turn):
    """stack.tools.generate --chat: BOS + the template's user turn + the assistant header (HF
    apply_chat_template with add_generation_prompt=True, here written out by hand); without
    --chat: BOS + the text."""
    from stack.data.tokenizers import ByteTokenizer
    from stack.tools.generate import encode_prompts

    tok = ByteTokenizer()
    prompts = ["What is 2+3?", "hi"]
    chat = encode_prompts(prompts, tok, (template, "byte"), 256)
    assert chat == [[tok.bos_id, *tok.encode(turn.format(p=p))] for p in prompts]
    assert encode_prompts(prompts, tok, None, 256) == [[tok.bos_id, *tok.encode(p)] for p in prompts]


def test_chat_with_a_hugging_face_dir_without_a_tokenizer_is_refused_before_its_weights_are_read(tmp_path):
    """A HF dir without tokenizer.json has no chat template: --chat is one paragraph, raised
    before the weights (absent here) are read; without --chat the missing weights are what fails."""
    import json

    from stack.config.hf_config import hf_config
    from stack.errors import ConfigError
    from stack.tools.generate import load

    (tmp_path / "config.json").write_text(json.dumps(hf_config(CFG)))
    with pytest.raises(ConfigError, match="--chat: .* has no tokenizer.json"):
        load(str(tmp_path), chat=True)
    with pytest.raises(ConfigError, match="has neither model.safetensors"):
        load(str(tmp_path))
