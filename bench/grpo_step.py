"""Seconds per GRPO round on a tiny config and where they go, as shares of the round.

    python bench/grpo_step.py                # llama_tiny (2 layers, d_model 64), byte vocab,
    python bench/grpo_step.py --trials 5     # G=4, 16 prompts per round, 8 new tokens, fp32
    python bench/grpo_step.py --quick        # one trial

The parts are the real programs of a run (stack.engine.step, stack.algorithms.grpo), each timed
alone on the same round after compiling (the fastest of 5 calls): generation (the KV-cache sampler) and the old
log-probs (the training forward over the sampled sequences; skipped, 0, with one optimizer
step per round), which `collect` runs as one program; scoring (the reward functions in their worker
process, on the host); finalize (advantages) and the update. A round is collect + scoring + finalize
+ update. Goal:
generation under half of the round.
"""

import statistics
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from hydra import compose, initialize_config_module
from rows import emit  # bench/ is on sys.path when run as a script
from step_overhead import bench_args

from stack.algorithms.onpolicy import completion_logps
from stack.engine.trainer import Trainer
from stack.rollout import generate, sample_keys
from stack.run.build import build

SIZES = {"tiny": ["model=llama_tiny", "algorithm.num_generations=4", "algorithm.max_new_tokens=8",
                  "data.batch_size=16", "trainer.steps=8", "trainer.eval_batches=1"]}


def seconds(fn: Callable, make_args: Callable[[], tuple], repeats: int = 5) -> float:
    """The fastest of `repeats` calls after a compiling one (`make_args` gives fresh, e.g. undonated,
    inputs): one call of a few ms read up to twice its time when a slow spell of the machine hit it."""
    jax.block_until_ready(fn(*make_args()))
    times = []
    for _ in range(repeats):
        args = make_args()
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return min(times)


def round_parts(overrides: list[str]) -> dict[str, float]:
    with initialize_config_module("stack.conf", version_base=None):
        cfg = compose("config", overrides=["data=jsonl_prompts", "algorithm=grpo", "logger=jsonl", *overrides])
    exp = build(cfg, tempfile.mkdtemp())
    trainer, alg = Trainer(exp), exp.algorithm
    with jax.set_mesh(exp.mesh):
        run = trainer.start()
        batch, host, _ = trainer.feed.read()
        p, state, graphdef = run.programs, run.state.models_only(), trainer.parts.graphdef
        xp = p.collect(state, run.frozen, batch, True)
        scores = alg.score(xp, host)
        ready = p.finalize(xp, scores, run.state.algo)[0]
        one = jax.tree.map(lambda x: x[0], xp)
        keys = sample_keys(jax.random.key(0), one["index"], jnp.zeros_like(one["index"]))
        policy = lambda s: nnx.merge(graphdef, s.params, s.rest).policy  # noqa: E731
        gen = jax.jit(lambda s: generate(policy(s), one["prompt_ids"], one["prompt_mask"], keys, alg.sampling))
        old = jax.jit(lambda s: completion_logps(policy(s), one, alg.temperature))
        fresh = lambda: jax.tree.map(jnp.copy, run.state)  # noqa: E731  (update donates its state)
        parts = {"collect": seconds(p.collect, lambda: (state, run.frozen, batch, True)),
                 "generation": seconds(gen, lambda: (state,)),
                 "old log-probs": seconds(old, lambda: (state,)) if alg.keep_old else 0.0,
                 "scoring": seconds(alg.score, lambda: (xp, host)),
                 "finalize": seconds(p.finalize, lambda: (xp, scores, run.state.algo)),
                 "update": seconds(p.update, lambda: (fresh(), run.frozen, ready, 0))}
    exp.rewards.close()
    trainer.feed.close()
    return parts


def main() -> None:
    args = bench_args(__doc__, SIZES)
    for size in args.sizes:
        trials = [round_parts(SIZES[size]) for _ in range(args.trials)]
        med = {k: statistics.median(t[k] for t in trials) for k in trials[0]}
        total = med["collect"] + med["scoring"] + med["finalize"] + med["update"]
        shares = " | ".join(f"{k} {v / total:.2f}" for k, v in med.items() if k != "collect")
        print(f"{size}: {total * 1e3:.1f} ms per round (collect {med['collect'] * 1e3:.1f} ms); shares of the round: "
              f"{shares}; generation {'<' if med['generation'] < total / 2 else '>='} half of the round (goal <)")
        emit(f"generation / GRPO round ({size})", med["generation"] / total, "< 0.5")


if __name__ == "__main__":
    main()
