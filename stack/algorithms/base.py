"""The Algorithm protocol: everything the one trainer knows about an objective.

The trainer (stack.engine.trainer) runs *rounds*. Each round it
  1. reads `trainer.grad_accum × schedule.minibatches` data batches, stacked as
     `batch[n, B, ...]` (numeric columns on device; strings such as a prompt's `answer`
     stay on the host, in `host`);
  2. `xp = collect(models, frozen, state, batch, key, train=True)`: pure and jitted.
     DPO adds the reference's log-probs; an on-policy method samples completions here;
     `collect = None` (SFT) means the batch is the experience (no program runs). `xp`
     keeps a leading axis of n micro-batches `[n, b, ...]`;
  3. `scores = score(xp, host)`: on the host, optional (`score = None` skips it);
  4. `xp, state, metrics = finalize(xp, scores, state)`: pure and jitted (advantages,
     whitening, a KL controller's update); `finalize = None` for offline methods;
  5. `epochs × minibatches` optimizer steps. Minibatch i is `xp[i·a:(i+1)·a]` with
     a = `trainer.grad_accum` (with `schedule.shuffle`, rows of a fresh permutation per
     epoch); the step scans its micro-batches and sums the gradients and the
     `(numerator, denominator)` that `loss` returns: the loss is Σnum / Σden over the
     whole minibatch, so every item weighs the same however the batch is split.
     `num`/`den` may be vectors of terms (the loss is then Σ_i num_i / den_i, e.g. DPO
     plus an NLL term); `den` counts items (tokens, pairs) and may not depend on params.

`setup(policy, ctx)` runs once, before the first round: it returns the extra trained
modules (e.g. a value head), the frozen modules the loss or collect reads (e.g. the
reference: a frozen copy, another checkpoint, or nothing when `ctx.quant.base` can switch
the adapters off), and the initial algorithm state (a pytree carried in the TrainState
and checkpointed, e.g. an adaptive KL coefficient). `models` in every function is an
`nnx.Module` with the policy as `models.policy` and each extra module by its name;
`frozen` likewise (or None). The trainer never branches on the algorithm's name; it
reads `data_kinds`, `schedule`, `score` and `precomputes` only.

`precomputes`: what `collect` adds depends only on the frozen modules and the record
(DPO's reference log-probs with `precompute_reference=true`), so the trainer computes it
once per record before training (stack.engine.precompute), stores the tables with the data
state, and drops the frozen modules; `collect` then passes such batches through.

How GRPO and PPO plug in: `collect` samples G completions per prompt with the KV-cache
sampler and computes old and reference log-probs (and PPO's values) from the training
forward; `score` runs the reward functions on the host; `finalize` turns rewards into
group-relative (GRPO) or GAE (PPO) advantages and updates the KL coefficient; `loss`
is the clipped surrogate over minibatches, `schedule` = (num_iterations or ppo epochs,
minibatches). `evaluate` reports the mean reward of greedy completions (and, with
`eval.num_samples`, pass@k and maj@k of sampled ones: stack.algorithms.sampled_eval).
"""

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Protocol

import jax
import jax.numpy as jnp
from flax import nnx

Metrics = dict[str, jax.Array]
Batch = dict[str, jax.Array]
Terms = tuple[jax.Array, jax.Array]  # (numerator, denominator): scalars or vectors of terms


class Schedule(NamedTuple):
    """Optimizer steps per round: `epochs` passes over the experience, `minibatches` each;
    `shuffle`: the rows are drawn into minibatches by a new permutation every epoch."""

    epochs: int = 1
    minibatches: int = 1
    shuffle: bool = False
    generations: int = 1  # generation batches a round may draw while `keep` leaves rows out


@dataclass(frozen=True)
class Context:
    """What `setup` may use besides the policy."""

    quant: Any  # the quantization provider (stack.quant); `quant.base`: the adapters-off view
    tokenizer: Any = None  # stack.data.tokenizers: decodes completions for host scoring
    rewards: Any = None  # the `reward` group's scorer, for algorithms that score on the host
    seed: int = 0  # the run's seed (e.g. a new head's initial weights)
    model: Any = None  # the `model` group's config (a `hf:DIR` reference is checked against it)
    rows: Any = None  # the batch sharding [n, rows, ...]: host scoring reads and returns this process's rows
    eval: Any = None  # the `eval` config (GRPO, PPO: stack.algorithms.sampled_eval)
    rollout: Any = None  # the `rollout` config (GRPO, PPO: their engine, stack.rollout.paging_of)
    env: Any = None  # the `env` group's EnvRunner (GRPO's multi-turn rollouts), or None


@dataclass(frozen=True)
class Setup:
    """What `Algorithm.setup` returns."""

    trained: dict[str, nnx.Module] = field(default_factory=dict)  # next to the policy
    frozen: dict[str, nnx.Module] = field(default_factory=dict)  # read, never trained
    state: Any = ()  # initial algorithm state (a pytree)


class Algorithm(Protocol):
    """An objective; see the module docstring for when the trainer calls each member."""

    data_kinds: tuple[str, ...]  # the `data.kind`s whose records it reads
    schedule: Schedule
    precomputes: bool
    # collect(models, frozen, state, batch, key, train) -> xp, or None: the batch is the experience
    collect: Callable[..., Batch] | None
    score: Callable[[Batch, dict[str, Any]], Any] | None
    # scores_spec(xp shapes) -> the ShapeDtypeStruct `score` returns (mode=compile lowers finalize
    # and the update without scoring anything); None with score
    scores_spec: Callable[[Batch], jax.ShapeDtypeStruct] | None
    # finalize(xp, scores, state) -> (xp, state, metrics), or None: nothing to add
    finalize: Callable[[Batch, Any, Any], tuple[Batch, Any, Metrics]] | None
    # keep(xp, scores) -> bool [n, rows]: the rows worth training on (whole groups); the round draws
    # more generation batches (at most schedule.generations) until it has a batch of them. None: all
    keep: Callable[[Batch, Any], jax.Array] | None
    # interact(turn, batch, host, train) -> batch: rolls completions out on the host, turn by turn
    # (multi-turn environments), before collect; `turn(b)` runs `alg.turn(models, b, key, train)` on
    # device with collect's key. None: collect samples on its own
    interact: Callable[..., Batch] | None

    def setup(self, policy: nnx.Module, ctx: Context) -> Setup: ...

    def loss(self, models: nnx.Module, batch: Batch, frozen: nnx.Module | None, state: Any,
             key: jax.Array) -> tuple[Terms, Metrics]: ...

    def evaluate(self, models: nnx.Module, xp: Batch, scores: Any, frozen: nnx.Module | None,
                 state: Any) -> Metrics: ...

    def batch_tokens(self, batch: dict[str, Any]) -> int:
        """Tokens the model processes for `batch` (for throughput and MFU)."""
        ...


def ratio(terms: Terms) -> jax.Array:
    """Σ_i num_i / den_i; a term that counts no items (den 0, num 0) adds 0, not NaN."""
    num, den = terms
    return jnp.sum(num / jnp.where(den == 0, 1.0, den))


def map_micro(fn: Callable[[Batch], Any], xp: Batch) -> Any:
    """`fn` over the leading micro-batch axis of `xp` (sequentially: one micro-batch's
    activations live at a time), outputs stacked."""
    if next(iter(xp.values())).shape[0] == 1:  # one micro-batch: no loop around it
        return jax.tree.map(lambda x: x[None], fn(jax.tree.map(lambda x: x[0], xp)))
    return jax.lax.map(fn, xp)


def loss_metrics(loss: Callable, models: nnx.Module, xp: Batch, frozen: Any, state: Any) -> Metrics:
    """The loss and its metrics, averaged over the micro-batches of `xp` (offline `evaluate`)."""

    def one(batch: Batch) -> Metrics:
        terms, metrics = loss(models, batch, frozen, state, jax.random.key(0))
        return {**metrics, "loss": ratio(terms)}

    return jax.tree.map(lambda x: x.mean(0), map_micro(one, xp))


def real_tokens(batch: Batch) -> Metrics:
    """`packing_efficiency`: the fraction of input positions holding real tokens (packed or padded rows)."""
    return {"packing_efficiency": (batch["segment_ids"] > 0).mean()} if "segment_ids" in batch else {}
