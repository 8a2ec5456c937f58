"""The paged engine (continuous batching over a paged KV cache) against the static engine, its page
bookkeeping by hand, and the `rollout` keys through GRPO's trainer."""

from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stack.config.validate import validate
from stack.errors import ConfigError
from stack.models.init import init_model
from stack.rollout import Paging, Sampling, generate, sample_keys
from stack.rollout.paged import sizes
from tests.helpers import make_cfg

B, P, NEW = 10, 7, 9


def prompts(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """B left-padded prompts of 1..P tokens."""
    rng = np.random.default_rng(seed)
    ids, mask = np.zeros((B, P), np.int32), np.zeros((B, P), np.int32)
    for b, n in enumerate(rng.integers(1, P + 1, B)):
        ids[b, P - n:], mask[b, P - n:] = rng.integers(3, 250, n), 1
    return ids, mask


def both(model, s: Sampling, paging: Paging, seed: int = 0):
    """(static, paged) rollouts of the same prompts and keys, as NumPy."""
    ids, mask = prompts(seed)
    keys = sample_keys(jax.random.key(seed), jnp.arange(B), jnp.zeros(B, jnp.int32))
    run = lambda s: jax.tree.map(np.asarray, nnx.jit(lambda m, i, k, key: generate(m, i, k, key, s))(  # noqa: E731
        model, ids, mask, keys))
    return run(s), run(replace(s, paging=paging))


def assert_same(static, paged) -> None:
    np.testing.assert_array_equal(paged.tokens, static.tokens)
    np.testing.assert_array_equal(paged.mask, static.mask)
    np.testing.assert_array_equal(paged.truncated, static.truncated)
    np.testing.assert_allclose(paged.logps, static.logps, atol=1e-5, rtol=0)


# EOS ids 3..59 of a random model's near-uniform next token: completions end after 1 to NEW tokens
SAMPLED = Sampling(NEW, 1.0, eos_ids=tuple(range(3, 60)))


@pytest.fixture(scope="module")
def llama():
    return init_model(make_cfg([]).model, 0)


@pytest.mark.parametrize("paging", [
    Paging(slots=3, page_size=4),  # requests wait for a slot; several pages per request
    Paging(slots=4, page_size=2, pages=10),  # a pool smaller than the slots' longest requests: they wait for pages
    Paging(page_size=16),  # every row in a slot at once, one page each
], ids=["3-slots", "small-pool", "all-rows"])
def test_paged_samples_equal_the_static_engines(llama, paging):
    static, paged = both(llama, SAMPLED, paging)
    lengths = static.mask.sum(1)
    assert lengths.min() < NEW and static.truncated.any()  # rows end at different steps; some run to NEW
    assert_same(static, paged)


def test_greedy_and_top_k_top_p_sampling_are_the_static_engines_too(llama):
    assert_same(*both(llama, replace(SAMPLED, temperature=0.0), Paging(slots=2, page_size=4), seed=1))
    assert_same(*both(llama, replace(SAMPLED, temperature=0.8, top_k=20, top_p=0.9), Paging(slots=4, page_size=4)))


@pytest.mark.parametrize("model", ["mistral", "gemma3", "mixtral"])
def test_sliding_windows_soft_caps_and_experts_decode_as_the_static_engine(model):
    """Windows shorter than prompt + completion (the paged cache's slots are positions), Gemma's
    soft-capping, routed experts on a batch with idle slots."""
    cfg = make_cfg([f"model={model}", *([] if model == "gemma3" else ["model.sliding_window=6"])]).model
    assert_same(*both(init_model(cfg, 0), SAMPLED, Paging(slots=3, page_size=4), seed=2))


def test_pool_sizes_and_a_pool_too_small_for_one_request_is_a_clear_error():
    assert sizes(Paging(slots=3, page_size=4), B, P, NEW) == (3, 3 * 4 + 1, 4)  # ceil(16 / 4) pages per request
    assert sizes(Paging(page_size=16), B, P, NEW) == (B, B + 1, 1)
    with pytest.raises(ConfigError, match=r"rollout.pages'=4 cannot hold one request.*>= 5"):
        sizes(Paging(slots=3, page_size=4, pages=4), B, P, NEW)


@pytest.mark.parametrize("overrides, match", [
    (["rollout.engine=vllm"], "Unknown value 'vllm' for 'rollout.engine'"),
    (["rollout.engine=paged", "rollout.slots=0"], r"'rollout.slots'=0 must be null"),
    (["rollout.slots=4"], r"sizes the paged engine, and rollout.engine='static'"),
    (["rollout.engine=paged", "rollout.pages=1"], "scratch page"),
])
def test_bad_rollout_keys_are_one_clear_error(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(make_cfg(["algorithm=grpo", "data=jsonl_prompts", *overrides]))
    with pytest.raises(ConfigError, match="generates nothing"):
        validate(make_cfg(["rollout.engine=paged"]))  # SFT


def test_a_grpo_round_with_the_paged_engine_equals_the_static_one(tmp_path):
    """Through the trainer (collect, score, update, greedy eval): the same losses, rewards and eval."""
    from stack.engine.trainer import train
    from stack.run.build import build
    from tests.helpers import captured

    def run(extra: list[str], where: str) -> dict:
        cfg = make_cfg(["algorithm=grpo", "data=jsonl_prompts", "algorithm.max_new_tokens=6", "data.batch_size=4",
                        "algorithm.num_generations=4", "trainer.steps=2", "trainer.log_every=1",
                        "trainer.eval_batches=1", "logger=[]", *extra, f"run_dir={tmp_path / where}"])
        exp, _ = captured(build(cfg, str(tmp_path / where)))
        summary = train(exp)
        exp.rewards.close()
        return {**summary.eval, **summary.train}

    static = run([], "static")
    paged = run(["rollout.engine=paged", "rollout.slots=5", "rollout.page_size=4"], "paged")
    assert set(paged) == set(static) >= {"train/loss", "train/reward", "train/completions/mean_length", "eval/reward"}
    for k, v in static.items():
        np.testing.assert_allclose(paged[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


def test_the_sampling_tool_draws_the_same_texts_with_the_paged_engine(llama):
    """stack.tools.generate (`--engine paged --slots 2`, and stack.generate): the static engine's texts."""
    from types import SimpleNamespace

    from stack.data.tokenizers import ByteTokenizer
    from stack.tools.generate import sample

    tokenizer, encoded = ByteTokenizer(), [[1, *b"12+7="], [1, *b"3+40="], [1, *b"5+5="]]
    args = dict(max_new_tokens=6, temperature=1.0, top_k=0, top_p=1.0, greedy=False, num_samples=3, seed=0,
                page_size=4)
    static = sample(llama, tokenizer, encoded, SimpleNamespace(**args, engine="static", slots=0), 64)
    paged = sample(llama, tokenizer, encoded, SimpleNamespace(**args, engine="paged", slots=2), 64)
    assert paged == static and len({t for texts in static for t in texts}) > 3
