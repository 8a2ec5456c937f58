"""Decode throughput with the KV cache over recomputing the whole sequence for every token; the paged
engine's continuous batching over the static engine on a GRPO-shaped round.

    python bench/rollout.py                  # tiny and medium, 128 new tokens, batch 8; the GRPO round (tiny)
    python bench/rollout.py --sizes tiny --trials 5
    python bench/rollout.py --quick          # tiny, one trial

Both decode greedily from the same prompts with the same model in one jitted program each:
ours (`stack.rollout.generate`: prefill, then one token per `while_loop` step against the
cache) and the baseline, which runs the full causal forward over the fixed-size
[batch, prompt + new] buffer for every new token (static shapes, no cache). The tokens are
checked equal; the ratio of tokens/s is printed (goal >= 5x at 128 new tokens).

The GRPO round (stack.rollout.paged): 64 prompts x 8 samples at temperature 1, up to 512 new tokens,
on the tiny model. Its random weights make every next token nearly uniform over the vocabulary, and
EOS_SHARE of it counts as an end of completion: lengths are geometric (most end within ~100 tokens,
a few reach 512), a long tail as RL completions have. Both engines draw the same samples (checked);
printed: completion tokens/s paged / static (goal >= 2) and the KV cache's bytes (paged pool /
static rows, goal <= 0.5).
"""

import statistics
import time
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from hydra import compose, initialize_config_module
from rows import emit  # bench/ is on sys.path when run as a script
from step_overhead import bench_args

from stack.models.init import init_model
from stack.models.kv_cache import init_cache, init_paged
from stack.rollout import Paging, Sampling, generate, sample_keys
from stack.rollout.paged import sizes

SIZES = {
    "tiny": ["model=llama_tiny"],
    "medium": ["model.d_model=512", "model.n_layers=4", "model.n_heads=8", "model.n_kv_heads=4", "model.d_ff=1408"],
}
BATCH, PROMPT, NEW = 8, 32, 128
ROUND = {"prompts": 64, "group": 8, "prompt": 32, "new": 512}  # the GRPO round of the paged engine's case
EOS_SHARE = 4  # EOS ids 3..6 of the tiny model's 384-token vocabulary: ~1% per token, mean length ~100
PAGING = Paging(slots=64, page_size=16)


def recompute(model, ids: jax.Array, new: int) -> jax.Array:
    """Greedy decoding by a full forward over the whole buffer for every token."""
    b, p = ids.shape
    buffer = jnp.concatenate([ids, jnp.zeros((b, new), ids.dtype)], 1)

    def step(t, buf):
        logits = model(buf)
        token = jnp.argmax(jax.lax.dynamic_index_in_dim(logits, p + t - 1, axis=1, keepdims=False), -1)
        return jax.lax.dynamic_update_slice(buf, token[:, None].astype(buf.dtype), (0, p + t))

    return jax.lax.fori_loop(0, new, step, buffer)[:, p:]


def timed(fn, *args) -> tuple[float, np.ndarray]:
    out = jax.block_until_ready(fn(*args))  # compile
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - start, np.asarray(out)


def main() -> None:
    args = bench_args(__doc__, SIZES)
    for size in args.sizes:
        with initialize_config_module("stack.conf", version_base=None):
            cfg = compose("config", overrides=SIZES[size] + [f"model.max_seq_len={PROMPT + NEW}"])
        model = init_model(cfg.model, 0)
        ids = jnp.asarray(np.random.default_rng(0).integers(3, 259, (BATCH, PROMPT)), jnp.int32)
        mask, keys = jnp.ones_like(ids), jax.random.split(jax.random.key(0), BATCH)
        s = Sampling(NEW, temperature=0.0)
        cached = nnx.jit(lambda m, i, k: generate(m, i, mask, k, s).tokens)
        full = nnx.jit(lambda m, i: recompute(m, i, NEW))
        ours, base = [], []
        for _ in range(args.trials):
            t_ours, a = timed(cached, model, ids, keys)
            t_base, b = timed(full, model, ids)
            assert (a == b).all(), "the cached and recomputed greedy tokens differ"
            ours.append(t_ours)
            base.append(t_base)
        o, r = statistics.median(ours), statistics.median(base)
        print(f"{size:7s} batch {BATCH}, prompt {PROMPT}, {NEW} new tokens: KV cache {BATCH * NEW / o:9,.0f} tok/s | "
              f"recompute {BATCH * NEW / r:9,.0f} tok/s | ratio {r / o:.1f}x (goal >= 5x)")
        emit(f"KV-cache decode speed-up ({size})", r / o, ">= 5")
    grpo_round(args.trials)


def cache_bytes(model, paging: Paging | None, rows: int, prompt: int, new: int) -> int:
    """The bytes of the KV cache an engine allocates for `rows` completions (shapes only)."""
    if paging is None:
        shapes = jax.eval_shape(lambda: init_cache(model, rows, prompt + new))
    else:
        slots, pages, width = sizes(paging, rows, prompt, new)
        shapes = jax.eval_shape(lambda: init_paged(model, slots, pages, paging.page_size, width))
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes))


def grpo_round(trials: int) -> None:
    """The paged engine over the static one on ROUND (tiny): completion tokens/s, cache bytes."""
    with initialize_config_module("stack.conf", version_base=None):
        cfg = compose("config", overrides=["model=llama_tiny", f"model.max_seq_len={ROUND['prompt'] + ROUND['new']}"])
    model, n, g = init_model(cfg.model, 0), ROUND["prompts"], ROUND["group"]
    prompts = np.random.default_rng(0).integers(3 + EOS_SHARE, 259, (n, ROUND["prompt"]))
    ids = jnp.asarray(np.repeat(prompts, g, 0), jnp.int32)
    keys = sample_keys(jax.random.key(0), jnp.repeat(jnp.arange(n), g), jnp.tile(jnp.arange(g), n))
    mask = jnp.ones_like(ids)
    s = Sampling(ROUND["new"], 1.0, eos_ids=tuple(range(3, 3 + EOS_SHARE)))
    engines = {"static": s, "paged": replace(s, paging=PAGING)}
    runs = {k: nnx.jit(lambda m, i, k_, s=v: generate(m, i, mask, k_, s)) for k, v in engines.items()}
    outs = {k: jax.tree.map(np.asarray, jax.block_until_ready(f(model, ids, keys))) for k, f in runs.items()}  # compile
    assert (outs["static"].tokens == outs["paged"].tokens).all(), "the engines' samples differ"
    times = {k: [] for k in runs}
    for _ in range(trials):
        for k, f in runs.items():
            start = time.perf_counter()
            jax.block_until_ready(f(model, ids, keys))
            times[k].append(time.perf_counter() - start)
    lengths = outs["static"].mask.sum(1)
    tokens = {k: lengths.sum() / statistics.median(t) for k, t in times.items()}
    memory = {k: cache_bytes(model, v.paging, n * g, ROUND["prompt"], ROUND["new"]) for k, v in engines.items()}
    print(f"GRPO round, {n} prompts x {g}, up to {ROUND['new']} new tokens (lengths: mean {lengths.mean():.0f}, "
          f"median {np.median(lengths):.0f}, {(lengths == ROUND['new']).sum()} at the cap), {PAGING}: "
          f"static {tokens['static']:,.0f} tok/s, {memory['static'] / 2**20:.1f} MiB cache | paged "
          f"{tokens['paged']:,.0f} tok/s, {memory['paged'] / 2**20:.1f} MiB")
    emit("paged / static engine tokens/s (GRPO round, tiny)", tokens["paged"] / tokens["static"], ">= 2")
    emit("paged / static KV-cache bytes (GRPO round, tiny)", memory["paged"] / memory["static"], "<= 0.5")


if __name__ == "__main__":
    main()
