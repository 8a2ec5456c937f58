"""Seconds per GRPO round: stack's trainer vs Google Tunix 0.1.7's GRPOLearner, same process.

    python3.11 -m venv ~/venv-tunix && ~/venv-tunix/bin/pip install -e '.[dev]' google-tunix==0.1.7
    ~/venv-tunix/bin/python bench/tunix_grpo.py --trials 3      # --rounds 10 --warmup 2

Tunix is not a dependency of stack: run this from a separate venv that has both (it is the
only file that imports tunix; google-tunix 0.1.7 installs beside jax 0.10.2 / flax 0.12.8).
The config is the tiny one of bench/grpo_step.py: Llama, 2 layers, d_model 64, 4 heads /
2 KV heads, d_ff 176, vocab 384 (untied; 141,632 params on both sides), byte tokenizer,
16 prompts of recipes/data/prompts_train.jsonl per round, G = 4, 8 new tokens, temperature 1,
fp32, beta 0 (no reference), num_iterations 1 (one optimizer step per round), the same Optax
chain (stack's AdamW, built once and given to both), reward: stack's `accuracy`.

- stack: the real trainer (`Trainer(build(cfg, dir)).run()`, its default hooks less the eval
  one, as Tunix runs no eval) with a hook that blocks on the params after each round and reads
  the trainer's clock (wall time less the logging pauses).
- Tunix: `GRPOLearner` on an `RLCluster` with the vanilla sampler, actor = rollout on one
  1x1 ('fsdp', 'tp') CPU mesh (so they share weights: no weight sync), Tunix's own Llama3
  module with the same shapes, prompts rendered with stack's chat template and cut to the
  last 47 bytes (BOS + 47 = `max_prompt_length` 48, stack's `data.seq_len`), KV cache of
  48 + 8. Its `_run_global_step` (one round) is wrapped to block on the params and read
  the clock.
Each trial builds both afresh and runs `--rounds` rounds; the first `--warmup` rounds
(compilation) and the last one (stack's end-of-run logging) are dropped, and the median of
the rest is the trial's seconds per round.
Trials alternate (stack, Tunix, ...); the median over trials and the ratio are printed.

Caveats: a round is not quite the same work in both. Both skip the old log-probs forward
at num_iterations = 1 (the loss uses stop_gradient of the current ones). stack reads
prompts through its Grain pipeline and scores in a reward worker process; Tunix iterates
pre-rendered prompt strings (tokenized per round on the host) and calls the reward
function in-process. Its completions stop before EOS (stack's include it); its sampler
reuses one seed every round (RolloutConfig.seed None -> PRNGKey(0)). Both models are
untrained: EOS is rarely sampled, so both decode loops run all 8 steps, and every reward is
0 (zero advantages; the update does the same work). The weights differ (Tunix's Llama3 has
its own init: zero MLPs), not the work. Importing tunix sets flax's
`flax_always_shard_variable` to False process-wide; it is restored for stack's trials.
Timings on a 2-core shared CPU are noisy (±15 %).
"""

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from typing import Any

import flax
import jax
import numpy as np
from flax import nnx
from hydra import compose, initialize_config_module
from omegaconf import DictConfig
from rows import emit  # bench/ is on sys.path when run as a script

from stack.data import records
from stack.data.chat import TEMPLATES
from stack.data.tokenizers import ByteTokenizer
from stack.engine.trainer import Trainer
from stack.engine.trainer.context import Hook, Run
from stack.engine.trainer.evaluation import Evaluation
from stack.rewards.functions import accuracy
from stack.run.build import build

SIZES = {"tiny": ["model=llama_tiny", "algorithm.num_generations=4", "algorithm.max_new_tokens=8",
                  "data.batch_size=16", "reward.functions=[accuracy]", "trainer.eval_every=0",
                  "trainer.eval_batches=1"]}
SHARD_VARIABLES = flax.config.flax_always_shard_variable  # flax's default, before tunix is imported


@contextmanager
def flax_flag(value: bool) -> Iterator[None]:
    """flax_always_shard_variable set to `value` inside the block (tunix flips it on import)."""
    old = flax.config.flax_always_shard_variable
    flax.config.update("flax_always_shard_variable", value)
    try:
        yield
    finally:
        flax.config.update("flax_always_shard_variable", old)


def steady(ends: list[float], warmup: int) -> float:
    """Median round time (differences of the round ends) without the first `warmup` rounds and
    the last one (in stack it holds the end-of-run logging: metric means, the CPU peak probe)."""
    return statistics.median(np.diff(ends)[warmup - 1:-1])


def experiment(size: str, rounds: int) -> Any:
    """The stack Experiment (stack.run.build) of `size` for `rounds` GRPO rounds."""
    with initialize_config_module("stack.conf", version_base=None):
        cfg = compose("config", overrides=["data=jsonl_prompts", "algorithm=grpo", "logger=jsonl",
                                           *SIZES[size], f"trainer.steps={rounds}"])
    cfg.trainer.log_every = rounds  # one logging sync, at the end
    return build(cfg, tempfile.mkdtemp())


class RoundClock(Hook):
    """The trainer's clock (wall time less logging pauses) at the end of each round, once the
    update has finished."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def after_round(self, run: Run) -> None:
        jax.block_until_ready(run.state.params)
        self.ends.append(run.clock.now())


def stack_round(size: str, rounds: int, warmup: int) -> float:
    exp = experiment(size, rounds)
    trainer, clock = Trainer(exp), RoundClock()
    trainer.hooks = [h for h in trainer.hooks if not isinstance(h, Evaluation)] + [clock]  # Tunix runs no eval
    try:
        with flax_flag(SHARD_VARIABLES):
            trainer.run()
    finally:
        exp.rewards.close()
    assert len(clock.ends) == rounds, clock.ends
    return steady(clock.ends, warmup)


class TunixBytes:
    """stack's ByteTokenizer in the shape Tunix's TokenizerAdapter accepts (id methods)."""

    tok = ByteTokenizer()

    def encode(self, text: str, **_) -> list[int]:
        return self.tok.encode(text)

    def decode(self, ids: list[int], **_) -> str:
        return self.tok.decode(ids)

    def bos_id(self) -> int:
        return self.tok.bos_id

    def eos_id(self) -> int:
        return self.tok.eos_id

    def pad_id(self) -> int:
        return self.tok.pad_id


def tunix_batches(cfg: DictConfig, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
    """Endless batches {prompts, answer} (string arrays: Tunix repeats every leaf G times)."""
    tok, keep = ByteTokenizer(), cfg.data.seq_len - 1  # Tunix prepends BOS
    rows = []
    with open(cfg.data.path) as f:
        for i, line in enumerate(f):
            pieces, answer = records.prompt_pieces(json.loads(line), f"line {i}", TEMPLATES[cfg.data.chat_template])
            rows.append((tok.decode(tok.encode("".join(t for t, _ in pieces))[-keep:]), answer))
    for start in range(0, 1 << 30, batch_size):
        batch = [rows[(start + j) % len(rows)] for j in range(batch_size)]
        yield {"prompts": np.array([p for p, _ in batch]), "answer": np.array([a for _, a in batch])}


def tunix_model(mc: DictConfig, mesh: jax.sharding.Mesh) -> nnx.Module:
    """Tunix's Llama3 with the shapes of stack's `model` config (random init, fp32)."""
    from tunix.models.llama3 import model as llama

    config = llama.ModelConfig(
        num_layers=mc.n_layers, vocab_size=mc.vocab_size, embed_dim=mc.d_model, hidden_dim=mc.d_ff,
        num_heads=mc.n_heads, head_dim=mc.head_dim or mc.d_model // mc.n_heads, num_kv_heads=mc.n_kv_heads,
        rope_theta=int(mc.rope_theta), norm_eps=mc.norm_eps, weight_tying=mc.tie_embeddings)
    with jax.set_mesh(mesh):
        return llama.Llama3(config, rngs=nnx.Rngs(0))


def tunix_learner(exp: Any, rounds: int) -> Any:
    """A GRPOLearner for `exp`'s model shapes, algorithm, batch and Optax chain (actor = rollout)."""
    from tunix.rl import rl_cluster as rlc
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout

    cfg, alg = exp.cfg, exp.algorithm
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    training = rlc.RLTrainingConfig(actor_optimizer=exp.tx, eval_every_n_steps=rounds + 1, max_steps=rounds)
    new = alg.sampling.max_new_tokens
    rollout = base_rollout.RolloutConfig(max_tokens_to_generate=new, temperature=alg.temperature, top_p=1.0,
                                         top_k=None, max_prompt_length=cfg.data.seq_len,
                                         kv_cache_size=cfg.data.seq_len + new)
    cluster = rlc.RLCluster(
        actor=tunix_model(cfg.model, mesh), reference=None, tokenizer=TunixBytes(),
        cluster_config=rlc.ClusterConfig(role_to_mesh=dict.fromkeys(rlc.Role, mesh), rollout_engine="vanilla",
                                         offload_to_cpu=False, training_config=training, rollout_config=rollout))
    algo = grpo_learner.GRPOConfig(num_generations=alg.group, num_iterations=alg.schedule.epochs, beta=alg.beta,
                                   epsilon=alg.eps_low, loss_agg_mode="token-mean")  # token-mean: stack's dapo
    return grpo_learner.GRPOLearner(cluster, algo, reward_fns=[accuracy])


def tunix_round(size: str, rounds: int, warmup: int) -> float:
    exp = experiment(size, rounds)  # for its config and Optax chain; its model is not used
    exp.rewards.close()
    with flax_flag(False):  # what importing tunix sets
        learner = tunix_learner(exp, rounds)
        assert not learner.should_sync_weights  # actor and rollout share the weights
        ends: list[float] = []
        run_round = learner._run_global_step  # one round: generate, score, advantages, update

        def timed(*args, **kwargs) -> None:
            run_round(*args, **kwargs)
            jax.block_until_ready(nnx.state(learner.rl_cluster.actor_trainer.model))
            ends.append(time.perf_counter())

        learner._run_global_step = timed
        learner.train(tunix_batches(exp.cfg, exp.cfg.data.batch_size))
    assert len(ends) == rounds, ends
    return steady(ends, warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=10, help="rounds (= optimizer steps) per trial")
    parser.add_argument("--warmup", type=int, default=2, help="first rounds dropped (compilation)")
    args = parser.parse_args()
    if args.rounds < args.warmup + 2 or args.warmup < 1:
        parser.error("need --warmup >= 1 and --rounds >= --warmup + 2 (the last round is dropped too)")
    print(f"jax {jax.__version__}, flax {flax.__version__}, tunix {version('google-tunix')} on "
          f"{jax.devices()[0].platform}; {args.trials} alternating trials of {args.rounds} rounds, "
          f"the first {args.warmup} and the last dropped")
    for size in args.sizes:
        ours, theirs = [], []
        for _ in range(args.trials):
            ours.append(stack_round(size, args.rounds, args.warmup))
            theirs.append(tunix_round(size, args.rounds, args.warmup))
            print(f"  trial: stack {ours[-1] * 1e3:.1f} ms, tunix {theirs[-1] * 1e3:.1f} ms per round", flush=True)
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"{size}: stack {a * 1e3:.1f} ms per round (min {min(ours) * 1e3:.1f}) | tunix {b * 1e3:.1f} ms "
              f"(min {min(theirs) * 1e3:.1f}) | ratio stack/tunix of medians {a / b:.3f}, of mins "
              f"{min(ours) / min(theirs):.3f} (goal < 1)")
        emit(f"stack / Tunix GRPO round ({size})", a / b, "< 1")
        print("  a round: sample + reward + advantages + 1 update in both (no old log-probs forward at "
              "num_iterations 1); stack scores in a worker process, tunix in-process")


if __name__ == "__main__":
    main()
