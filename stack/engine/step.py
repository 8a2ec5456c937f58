"""The train state and the compiled programs of a run, shared by training and `mode=compile`.

`TrainState` is one pytree: the trained params (the policy's trainable variables and any
extra trained module), the rest of the modules' state (frozen base weights, quantized
weights: passed through the step, never a compiled constant), the optimizer state, the
algorithm state, the optimizer step count and the run's base PRNG key (raw key data).
Module states are pure nested dicts (`nnx.to_pure_dict`), merged with their graph inside
the jitted programs: flattening them on every call costs a fifth of an `nnx.State`'s.

`make_programs` returns the jitted functions the trainer runs each round (collect, finalize,
update, evaluate; `collect_update` for rounds with nothing between the two; `interact`, a host
loop of a jitted turn program, for multi-turn rollouts); `mode=compile` lowers the very same
functions. `update` is the one train step: it scans the micro-batches of its minibatch, sums
the gradients and the loss's (numerator, denominator) and divides once, so every counted item
(token, pair) weighs the same however the minibatch is split.
Keys: every random draw comes from `key` (the seed), split by purpose with `fold_in` (loss,
collect, eval), then by the optimizer step: a run draws the same numbers, resumed or not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from stack.algorithms.base import Batch, Context, Metrics, ratio
from stack.engine.routed import routed_loss
from stack.hardware.mesh import batch_sharding, layout_on, opt_state_shardings

if TYPE_CHECKING:  # the experiment holds a precompile of this step's programs
    from stack.engine.experiment import Experiment

LOSS, COLLECT, EVAL, SHUFFLE = 1, 2, 3, 4  # purposes of the run's key (fold_in), then per step
SAVED = ("params", "opt_state", "algo", "step", "key")  # what a checkpoint holds (not `rest`)
BATCH_COUNTS = ("loss_tokens", "packing_efficiency")  # eval metrics of the batch, not the model


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class TrainState:
    params: Any  # the trained variables of `Models`, a pure nested dict of arrays
    rest: Any  # everything else in `Models` (e.g. LoRA's frozen base), likewise
    opt_state: Any  # None in the view `collect` and `evaluate` get (see `models_only`)
    algo: Any  # the algorithm's state (e.g. an adaptive KL coefficient); () if none
    step: jax.Array  # int32 scalar: optimizer steps done
    key: jax.Array  # uint32 key data of jax.random.key(seed)

    def saved(self) -> dict[str, Any]:
        """The part a checkpoint holds (`rest` is rebuilt from the config on every start)."""
        return {name: getattr(self, name) for name in SAVED}

    def models_only(self) -> "TrainState":
        """The state without the optimizer's: what `collect` and `evaluate` read."""
        return replace(self, opt_state=None)


class Models(nnx.Module):
    """The modules of a run by name: `policy` plus the algorithm's extra trained (or frozen) ones."""

    def __init__(self, **modules: nnx.Module):
        for name, module in modules.items():
            setattr(self, name, module)


def trained_filter(policy_filter: Any) -> Any:
    """The policy's trainable variables (per the quantization provider), and all params of
    the other trained modules (e.g. a value head)."""
    return nnx.Any(nnx.All(nnx.PathContains("policy"), policy_filter),
                   nnx.All(nnx.Not(nnx.PathContains("policy")), nnx.Param))


@dataclass(frozen=True)
class Parts:
    """A run's modules, split: static graph definitions and their initial states."""

    graphdef: Any
    params: Any
    rest: Any
    frozen_graphdef: Any  # None: no frozen modules
    frozen: Any
    algo: Any = field(default=())


def split_models(exp: Experiment) -> Parts:
    """Run the algorithm's `setup` on the policy and split the modules into states."""
    ctx = Context(exp.quant, exp.tokenizer, exp.rewards, exp.cfg.seed, exp.cfg.model,
                  batch_sharding(exp.mesh, exp.rules), exp.cfg.eval, exp.cfg.rollout, exp.env)
    setup = exp.algorithm.setup(exp.model, ctx)
    graphdef, params, rest = nnx.split(Models(policy=exp.model, **setup.trained),
                                       trained_filter(exp.quant.trainable), ...)
    frozen_graphdef, frozen = nnx.split(Models(**setup.frozen)) if setup.frozen else (None, None)
    pure = nnx.to_pure_dict
    return Parts(graphdef, pure(params), pure(rest), frozen_graphdef, frozen if frozen is None else pure(frozen),
                 setup.state)


def state_shardings(exp: Experiment, parts: Parts) -> TrainState:
    """Where each leaf of the TrainState lives: params and rest as created (logical rules),
    param-shaped optimizer leaves like their params, scalars replicated."""
    replicated = NamedSharding(exp.mesh, PartitionSpec())
    on_mesh = lambda tree: jax.tree.map(lambda x: layout_on(exp.mesh, x), tree)  # noqa: E731
    return TrainState(on_mesh(parts.params), on_mesh(parts.rest),
                      opt_state_shardings(exp.tx, parts.params, exp.mesh),
                      jax.tree.map(lambda _: replicated, parts.algo), replicated, replicated)


def initial_state(exp: Experiment, parts: Parts, abstract: bool = False) -> TrainState:
    """The state before step 1 (ShapeDtypeStructs with their shardings when `abstract`)."""
    shardings = state_shardings(exp, parts)
    key = jax.random.key_data(jax.random.key(exp.cfg.seed))
    if abstract:
        shapes = TrainState(parts.params, parts.rest, jax.eval_shape(exp.tx.init, parts.params), parts.algo,
                            jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct(key.shape, key.dtype))
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings)
    opt_state = jax.jit(exp.tx.init, out_shardings=shardings.opt_state)(parts.params)
    put = lambda x: jax.device_put(x, shardings.step)  # noqa: E731
    return TrainState(parts.params, parts.rest, opt_state, jax.tree.map(put, parts.algo),
                      put(jnp.zeros((), jnp.int32)), put(key))


def abstract_frozen(exp: Experiment, parts: Parts) -> Any:
    """The frozen modules' state as ShapeDtypeStructs laid out on the mesh (mode=compile)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=layout_on(exp.mesh, x)),
                        parts.frozen)


def purpose_key(state: TrainState, purpose: int, per_step: bool = True) -> jax.Array:
    """The key of `purpose`, at the state's step when `per_step`."""
    base = jax.random.fold_in(jax.random.wrap_key_data(state.key), purpose)
    return jax.random.fold_in(base, state.step) if per_step else base


def accumulate(loss_fn: Callable, params: Any, micro: Batch, key: jax.Array) -> tuple[Any, jax.Array, Metrics]:
    """(gradients, loss, metrics) of Σnum / Σden over the micro-batches `micro` [a, b, ...].

    `loss_fn(params, batch, key) -> ((num, den), metrics)`. With a > 1 the denominators are
    summed first (a pass that XLA reduces to the masks: `den` may not depend on params), then
    a scan adds up the gradients of num / Σden; metrics are averaged over micro-batches.
    """
    a = jax.tree.leaves(micro)[0].shape[0]
    if a == 1:
        one = jax.tree.map(lambda x: x[0], micro)

        def whole(p: Any) -> tuple[jax.Array, Metrics]:
            terms, metrics = loss_fn(p, one, key)
            return ratio(terms), metrics

        (loss, metrics), grads = jax.value_and_grad(whole, has_aux=True)(params)
        return grads, loss, metrics
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(a))
    dens = jax.vmap(lambda b, k: loss_fn(params, b, k)[0][1])(micro, keys).sum(0)

    def part(p: Any, b: Batch, k: jax.Array) -> tuple[jax.Array, tuple[jax.Array, Metrics]]:
        (num, _), metrics = loss_fn(p, b, k)
        return ratio((num, dens)), (num, metrics)

    def body(total: Any, xs: tuple[Batch, jax.Array]) -> tuple[Any, tuple[jax.Array, Metrics]]:
        (_, out), grads = jax.value_and_grad(part, has_aux=True)(params, *xs)
        return jax.tree.map(jnp.add, total, grads), out

    grads, (nums, metrics) = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, params), (micro, keys))
    return grads, ratio((nums.sum(0), dens)), jax.tree.map(lambda x: x.mean(0), metrics)


def minibatch(xp: Batch, j: jax.Array, accum: int, schedule: Any, state: TrainState) -> Batch:
    """The micro-batches [accum, b, ...] of the round's j-th optimizer step (epoch j // m, minibatch
    i = j % m): `xp[i·accum:(i+1)·accum]`, or with `schedule.shuffle` (TRL PPOTrainer: a fresh
    permutation of the round's rows every epoch) the rows perm[i·accum·b:(i+1)·accum·b] of a
    permutation keyed by the round's first step and the epoch (so a resumed run draws the same)."""
    i = j % schedule.minibatches
    if not schedule.shuffle:
        return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, i * accum, accum), xp)
    n, b = jax.tree.leaves(xp)[0].shape[:2]
    key = jax.random.fold_in(purpose_key(state, SHUFFLE, per_step=False), state.step - j)
    perm = jax.random.permutation(jax.random.fold_in(key, j // schedule.minibatches), n * b)
    rows = jax.lax.dynamic_slice_in_dim(perm, i * accum * b, accum * b)
    return jax.tree.map(lambda x: x.reshape(n * b, *x.shape[2:])[rows].reshape(accum, b, *x.shape[2:]), xp)


@dataclass(frozen=True)
class Programs:
    """The jitted functions of a run (see the module docstring of stack.algorithms.base)."""

    collect: Callable  # (state.models_only(), frozen, batch, train) -> xp
    finalize: Callable  # (xp, scores, algo state) -> (xp, algo state, metrics)
    update: Callable  # (state, frozen, xp, j-th step of the round) -> (state, metrics); state donated
    evaluate: Callable  # (state.models_only(), frozen, xp, scores) -> metrics
    # (state, frozen, batch) -> (state, metrics): collect then the round's one update as one
    # program, for rounds with nothing between them (`one_program`); else None
    collect_update: Callable | None = None
    keep: Callable | None = None  # (xp, scores) -> bool [n, rows], replicated: the rows a round keeps
    # (state.models_only(), batch, host, train) -> batch: the algorithm's multi-turn rollouts, on the host
    # between runs of `turn`, its jitted turn program (state.models_only(), batch, train); None: collect samples
    interact: Callable | None = None
    turn: Callable | None = None


def _pass_batch(state: TrainState, frozen: Any, batch: Batch, train: bool) -> Batch:
    return batch


def _pass_xp(xp: Batch, scores: Any, algo: Any) -> tuple[Batch, Any, Metrics]:
    return xp, algo, {}


def one_program(alg: Any) -> bool:
    """Whether a round is collect then a single optimizer step with nothing between them: no host
    `score`, no `finalize` (DPO's reference log-probs). The trainer runs such a round as one
    program: one compilation instead of two (tiny DPO: ~0.5 s less XLA time), one dispatch per
    step, and no experience written out between programs; the bits are the same."""
    schedule = alg.schedule
    return (alg.collect is not None and alg.score is None and alg.finalize is None
            and schedule.epochs * schedule.minibatches == 1)


def collect_key(state: TrainState, train: bool) -> jax.Array:
    """The key of a round's collect (or of the eval's, the same at every eval)."""
    return purpose_key(state, COLLECT) if train else purpose_key(state, EVAL, per_step=False)


def turn_program(alg: Any, models: Callable[[TrainState], nnx.Module]) -> Callable | None:
    """`Programs.turn`: the algorithm's jitted turn, keyed as collect; None without `interact`."""
    if alg.interact is None:
        return None
    return jax.jit(lambda s, b, train: alg.turn(models(s), b, collect_key(s, train), train), static_argnums=2)


def interaction(alg: Any, turn: Callable | None) -> Callable | None:
    """`Programs.interact`: the algorithm's host loop, each turn a run of its jitted `turn` program."""
    if turn is None:
        return None

    def interact(state: TrainState, batch: Batch, host: dict, train: bool) -> Batch:
        return alg.interact(lambda b: turn(state, b, train), batch, host, train)

    return interact


def make_programs(exp: Experiment, parts: Parts, shardings: TrainState) -> Programs:
    """The run's jitted programs; `update` keeps the state in `shardings` and donates it."""
    alg, accum = exp.algorithm, exp.cfg.trainer.grad_accum
    models = lambda s: nnx.merge(parts.graphdef, s.params, s.rest)  # noqa: E731
    frozen_of = lambda f: None if f is None else nnx.merge(parts.frozen_graphdef, f)  # noqa: E731

    def collect(state: TrainState, frozen: Any, batch: Batch, train: bool) -> Batch:
        return alg.collect(models(state), frozen_of(frozen), state.algo, batch, collect_key(state, train), train)

    def update(state: TrainState, frozen: Any, xp: Batch, j: jax.Array) -> tuple[TrainState, Metrics]:
        micro = minibatch(xp, j, accum, alg.schedule, state)
        coef = exp.cfg.model.get("router_aux_loss_coef")
        loss_fn = lambda p, b, k: routed_loss(  # noqa: E731
            alg, coef, nnx.merge(parts.graphdef, p, state.rest), b, frozen_of(frozen), state.algo, k)
        grads, loss, metrics = accumulate(loss_fn, state.params, micro, purpose_key(state, LOSS))
        updates, opt_state = exp.tx.update(grads, state.opt_state, state.params)
        new = replace(state, params=optax.apply_updates(state.params, updates), opt_state=opt_state,
                      step=state.step + 1)
        lr = exp.schedule(state.step)  # the step's learning rate, logged as train/lr
        return new, {**metrics, "loss": loss, "grad_norm": optax.tree.norm(grads), "lr": lr}

    def evaluate(state: TrainState, frozen: Any, xp: Batch, scores: Any) -> Metrics:
        m, f = models(state), frozen_of(frozen)
        metrics = alg.evaluate(m, xp, scores, f, state.algo)
        # fake-quantized (QAT): the float model's metrics too, as float/*; offline algorithms only
        # (finalize None): GRPO/PPO's eval completions were sampled by the fake-quantized policy
        if exp.quant.unquantized is not None and alg.finalize is None:
            m.policy = exp.quant.unquantized(m.policy)
            metrics |= {f"float/{k}": v for k, v in alg.evaluate(m, xp, scores, f, state.algo).items()
                        if k not in BATCH_COUNTS}
        return metrics

    def collect_update(state: TrainState, frozen: Any, batch: Batch) -> tuple[TrainState, Metrics]:
        return update(state, frozen, collect(state.models_only(), frozen, batch, True), 0)

    turn = turn_program(alg, models)
    replicated = NamedSharding(exp.mesh, PartitionSpec())
    step = lambda f: jax.jit(f, donate_argnums=0, out_shardings=(shardings, replicated), keep_unused=True)  # noqa: E731
    # keep_unused: every input stays a program argument, so XLA's memory analysis of each
    # program counts all that is resident while it runs (mode=compile reports it).
    # An algorithm without collect / finalize gets a plain pass-through: no program to run.
    return Programs(
        collect=jax.jit(collect, static_argnums=3, keep_unused=True) if alg.collect else _pass_batch,
        finalize=jax.jit(alg.finalize) if alg.finalize else _pass_xp,
        update=step(update),
        evaluate=jax.jit(evaluate, out_shardings=replicated),
        collect_update=step(collect_update) if one_program(alg) else None,
        keep=jax.jit(alg.keep, out_shardings=replicated) if alg.keep is not None else None,
        interact=interaction(alg, turn), turn=turn,
    )
