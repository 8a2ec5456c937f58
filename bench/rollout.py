"""Decode throughput with the KV cache over recomputing the whole sequence for every token.

    python bench/rollout.py                  # tiny and medium, 128 new tokens, batch 8
    python bench/rollout.py --sizes tiny --trials 5
    python bench/rollout.py --quick          # tiny, one trial

Both decode greedily from the same prompts with the same model in one jitted program each:
ours (`stack.rollout.generate`: prefill, then one token per `while_loop` step against the
cache) and the baseline, which runs the full causal forward over the fixed-size
[batch, prompt + new] buffer for every new token (static shapes, no cache). The tokens are
checked equal; the ratio of tokens/s is printed (goal >= 5x at 128 new tokens).
"""

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from hydra import compose, initialize_config_module
from rows import emit  # bench/ is on sys.path when run as a script
from step_overhead import bench_args

from stack.models.init import init_model
from stack.rollout import Sampling, generate

SIZES = {
    "tiny": ["model=llama_tiny"],
    "medium": ["model.d_model=512", "model.n_layers=4", "model.n_heads=8", "model.n_kv_heads=4", "model.d_ff=1408"],
}
BATCH, PROMPT, NEW = 8, 32, 128


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


if __name__ == "__main__":
    main()
