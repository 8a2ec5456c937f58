"""The generic trainer: one jitted step, metrics on device until a logging step, eval, summary.

The loop knows nothing about the objective: the algorithm supplies `loss` (and optional
frozen state such as a reference model, or per-record columns it precomputes once; see
stack.precompute). Only `exp.trainable` params get gradients and optimizer state; the rest
of the model (e.g. LoRA's frozen base weights) is a step argument, never a compiled
constant. Gradient accumulation is `optax.MultiSteps` (built in stack.build): one call of
the step per micro-batch, `trainer.grad_accum` calls per optimizer step. Host syncs happen
only at logging/eval steps (and once after step 1 to separate compile time from throughput).
"""

import math
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from stack.build import Experiment
from stack.hardware import mfu_metrics
from stack.parallel import batch_sharding, opt_state_shardings, shardings_of
from stack.precompute import precompute_columns, with_columns


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or Inf (trainer.nan_policy=stop)."""


def make_train_step(graphdef: Any, algorithm: Any, tx: optax.GradientTransformation) -> Callable:
    """A pure (params, opt_state, fixed, batch, frozen) -> (params, opt_state, metrics) function."""

    def step(params, opt_state, fixed, batch, frozen):
        def loss_fn(p):
            return algorithm.loss(nnx.merge(graphdef, p, fixed), batch, frozen)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {**metrics, "loss": loss, "grad_norm": optax.tree.norm(grads)}
        if "segment_ids" in batch:  # the fraction of input positions holding real tokens
            metrics["packing_efficiency"] = (batch["segment_ids"] > 0).mean()
        return params, opt_state, metrics

    return step


def make_eval_step(graphdef: Any, algorithm: Any) -> Callable:
    """A pure (params, fixed, batch, frozen) -> metrics function."""

    def evaluate(params, fixed, batch, frozen):
        loss, metrics = algorithm.loss(nnx.merge(graphdef, params, fixed), batch, frozen)
        return {**metrics, "loss": loss}

    return evaluate


def _mean(window: list[dict[str, Any]], prefix: str) -> dict[str, float]:
    host = jax.device_get(window)  # the host sync of a logging step
    return {f"{prefix}{k}": float(np.mean([m[k] for m in host])) for k in host[0]}


def train(exp: Experiment) -> dict[str, float]:
    """Run `trainer.steps` optimizer steps of `exp`; return the summary metrics."""
    with jax.set_mesh(exp.mesh), nnx.logical_axis_rules(exp.rules):
        return _train(exp)


def jit_steps(exp: Experiment, state_shardings: tuple[Any, Any]) -> tuple[Callable, Callable]:
    """The jitted (train step, eval step) of `exp`: state donated and pinned to its layout.

    Also used by `mode=compile`, which lowers the same train step for abstract inputs.
    """
    graphdef = nnx.graphdef(exp.model)
    replicated = NamedSharding(exp.mesh, PartitionSpec())
    step_fn = jax.jit(make_train_step(graphdef, exp.algorithm, exp.tx), donate_argnums=(0, 1),
                      out_shardings=(*state_shardings, replicated))
    eval_fn = jax.jit(make_eval_step(graphdef, exp.algorithm), out_shardings=replicated)
    return step_fn, eval_fn


class Preemption:
    """Turns SIGTERM / SIGINT into a request to save and stop after the current step."""

    def __init__(self):
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "Preemption":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _check_finite(window: list[dict[str, Any]], step: int, policy: str) -> None:
    """Before a save: NaN/Inf in the unlogged steps stops the run, so no bad state is written."""
    losses = jax.device_get([m["loss"] for m in window])
    if policy == "stop" and not all(math.isfinite(float(x)) for x in losses):
        raise NonFiniteLoss(f"train/loss became non-finite before step {step}; stopping without "
                            "saving (trainer.nan_policy=stop). The last good checkpoint is kept.")


def _train(exp: Experiment) -> dict[str, float]:
    t, ckpt = exp.cfg.trainer, exp.checkpointer
    graphdef, params, fixed = nnx.split(exp.model, exp.trainable, ...)
    frozen = exp.algorithm.frozen(exp.model)
    # each param-shaped optimizer leaf is laid out like its param (jit alone would replicate it)
    opt_state = jax.jit(exp.tx.init, out_shardings=opt_state_shardings(exp.tx, params, exp.mesh))(params)
    step_fn, eval_fn = jit_steps(exp, shardings_of((params, opt_state)))
    data_sharding = batch_sharding(exp.mesh, exp.rules)
    abstract = _abstract({"params": params, "opt_state": opt_state})
    restored = ckpt.restore(abstract, columns=exp.algorithm.precomputes) if ckpt else None
    train_batches, host_evals, columns = exp.train_batches, exp.eval_batches, None
    if exp.algorithm.precomputes:  # once, from the initial model; they replace the frozen state
        columns = restored.columns if restored else precompute_columns(exp, graphdef, params, fixed, frozen,
                                                                        data_sharding)
        train_batches, host_evals = with_columns(exp, columns)
        frozen = None
    eval_batches = [jax.device_put(b, data_sharding) for b in host_evals]
    micro_tokens = exp.algorithm.batch_tokens(host_evals[0])
    it = iter(train_batches)
    first_step = 1
    if restored:  # into the current mesh's shardings, whatever mesh wrote it
        params, opt_state = restored.state["params"], restored.state["opt_state"]
        it.set_state(restored.data)
        first_step = restored.step + 1
        for sink in exp.sinks:
            sink.rewind(restored.step)
        print(f"resumed from {restored.where}", flush=True)
    meta = {"rng": jax.random.key_data(jax.random.key(exp.cfg.seed)).tolist(), "wandb_id": exp.wandb_id}

    def evaluate() -> dict[str, float]:
        return _mean([eval_fn(params, fixed, b, frozen) for b in eval_batches], "eval/")

    def emit(step: int, metrics: dict[str, float]) -> None:
        for sink in exp.sinks:
            sink.log(step, metrics)

    first_eval = last_eval = evaluate()
    if not restored:
        emit(0, first_eval)
    window: list[dict[str, Any]] = []
    start = time.perf_counter()
    compile_seconds, step, preempted = 0.0, first_step - 1, None
    t_window, window_steps, train_metrics, waited = start, 0, {}, 0.0
    try:
        with Preemption() as signals:
            data_state = it.get_state()
            batch = jax.device_put(next(it), data_sharding)
            for step in range(first_step, t.steps + 1):
                for _ in range(t.grad_accum):
                    params, opt_state, metrics = step_fn(params, opt_state, fixed, batch, frozen)
                    window.append(metrics)
                    data_state = it.get_state()  # what a checkpoint of this step resumes from
                    t_read = time.perf_counter()
                    batch = next(it)  # read while the step runs (async dispatch), then sent
                    waited += time.perf_counter() - t_read
                    batch = jax.device_put(batch, data_sharding)
                window_steps += 1
                if step == first_step:
                    jax.block_until_ready(metrics)
                    compile_seconds = time.perf_counter() - start
                    t_window, window_steps, waited = time.perf_counter(), 0, 0.0
                if step % t.log_every == 0 or step == t.steps:
                    train_metrics = _mean(window, "train/")
                    window = []
                    now = time.perf_counter()
                    train_metrics["data/epoch"] = train_batches.epoch(data_state)
                    if window_steps:
                        train_metrics["perf/tokens_per_sec"] = window_steps * t.grad_accum * micro_tokens / (now - t_window)
                        train_metrics["perf/step_seconds"] = (now - t_window) / window_steps
                        train_metrics["perf/data_wait_fraction"] = waited / (now - t_window)
                        train_metrics.update(mfu_metrics(exp.flops_per_token, train_metrics["perf/tokens_per_sec"],
                                                         exp.mesh.size, exp.peak_flops_per_device))
                    train_metrics["train/lr"] = float(jax.device_get(exp.schedule(step - 1)))
                    if not math.isfinite(train_metrics["train/loss"]) and t.nan_policy == "stop":
                        raise NonFiniteLoss(
                            f"train/loss is {train_metrics['train/loss']} at step {step}; stopping "
                            "(trainer.nan_policy=stop). Lower optimizer.lr or check the data."
                        )
                    if (t.eval_every and step % t.eval_every == 0) or step == t.steps:
                        last_eval = evaluate()
                        train_metrics.update(last_eval)
                    emit(step, train_metrics)
                    t_window, window_steps, waited = time.perf_counter(), 0, 0.0  # eval, logging: not step time
                elif t.eval_every and step % t.eval_every == 0:
                    jax.block_until_ready(params)  # queued train steps count as step time
                    eval_start = time.perf_counter()
                    last_eval = evaluate()
                    emit(step, last_eval)
                    t_window += time.perf_counter() - eval_start
                preempted = signals.signum
                tiers = [] if ckpt is None else ckpt.tiers if preempted or step == t.steps else ckpt.due(step)
                if tiers:
                    _check_finite(window, step, t.nan_policy)
                    ckpt.save(step, {"params": params, "opt_state": opt_state}, data_state, meta, tiers,
                              block=bool(preempted), columns=columns)
                if preempted:
                    break
        seconds = time.perf_counter() - start
        jax.block_until_ready(params)
    finally:
        it.close()  # stops Grain's reader threads / worker processes
    exp.model, exp.opt_state = nnx.merge(graphdef, params, fixed), opt_state
    steady, ran = seconds - compile_seconds, step - first_step + 1
    tokens_per_sec = (ran - 1) * t.grad_accum * micro_tokens / steady if steady > 0 and ran > 1 else 0.0
    return {
        **{k: v for k, v in train_metrics.items() if k.startswith("train/")},
        **last_eval,
        "eval/loss_at_start": first_eval["eval/loss"],
        "steps": step,
        "first_step": first_step,
        "preempted": float(preempted or 0),
        "seconds": seconds,
        "compile_seconds": compile_seconds,
        "perf/tokens_per_sec": tokens_per_sec,
        **mfu_metrics(exp.flops_per_token, tokens_per_sec, exp.mesh.size, exp.peak_flops_per_device),
    }
