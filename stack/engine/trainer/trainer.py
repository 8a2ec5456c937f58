"""The trainer: rounds of collect -> score -> finalize -> optimizer steps, with hooks around them.

    Trainer(exp).run() -> Summary

A round reads `grad_accum × schedule.minibatches` data batches (stack.engine.trainer.feed), runs the
algorithm's jitted `collect`, its host `score` (if any; with a `keep`, more generation batches while it
leaves rows out: stack.engine.trainer.refill) and jitted `finalize`, then `epochs ×
minibatches` optimizer steps (stack.engine.step); a round of collect and one step with nothing between
them (DPO) runs as one program (stack.engine.step.one_program). The loop body knows nothing about the
objective; everything else (logging window, throughput, NaN policy, eval, signals, checkpoints)
is a hook (stack.engine.trainer.context.Hook) that reads the run and adds to the logged row. The loop
waits for the device on a rhythm set by the step time (stack.engine.trainer.sync), for the step before
the newest, so the device never idles for it; a logging step's row is held until then and
completed by the hooks (`Hook.log`). Eval and checkpoint steps wait in their hooks. Rounds of
several optimizer steps (PPO's epochs) or scored on the host (GRPO, PPO: the host waits for the
device there anyway) wait at round starts only: held rows are emitted on a round boundary, each
with its round's share of the round's time, generation and scoring included (as TRL's PPO /
GRPO trainers time a batch's rollout and update).
"""

import math
import os
from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace
from typing import Any

import jax
from flax import nnx

from stack.engine.precompute import attach_columns, precompute_columns
from stack.engine.step import Parts, TrainState, initial_state, make_programs, split_models, state_shardings
from stack.engine.summary import Summary
from stack.engine.trainer.checkpointing import Checkpointing
from stack.engine.trainer.context import COMPLETED, RUNNING, Hook, Run
from stack.engine.trainer.evaluation import Evaluation
from stack.engine.trainer.feed import Feed, Round
from stack.engine.trainer.metrics import MetricsLog, PeakProbe, Throughput
from stack.engine.trainer.nonfinite import NonFinite
from stack.engine.trainer.profiler import Profiler
from stack.engine.trainer.refill import refill
from stack.engine.trainer.signals import Signals
from stack.engine.trainer.sync import Sync
from stack.errors import ConfigError
from stack.hardware.mesh import batch_sharding, global_batch


def default_hooks(exp, feed: Feed) -> list[Hook]:
    """The side concerns of a run, in the order they see each step."""
    t = exp.cfg.trainer
    guard = NonFinite(t.nan_policy)
    hooks: list[Hook] = [MetricsLog(feed), Throughput(feed), PeakProbe(), guard,
                         Evaluation(t.eval_every), Signals()]
    if exp.checkpointer is not None:
        hooks.append(Checkpointing(exp.checkpointer, guard, exp.cfg.checkpoint.overlap))
    if t.profile is not None:
        hooks.append(Profiler(*t.profile, os.path.join(exp.run_dir, "profile")))
    return hooks


def episodes(xp: dict[str, jax.Array]) -> int:
    """The completions sampled in a round (TRL's episodes): the rows of `completion` [n, R, N], else 0."""
    return math.prod(xp["completion"].shape[:-1]) if "completion" in xp else 0


class Trainer:
    """Runs `trainer.steps` optimizer steps of an Experiment; `state` holds the final TrainState."""

    def __init__(self, exp, hooks: list[Hook] | None = None):
        self.exp, self.alg = exp, exp.algorithm
        schedule = self.alg.schedule
        self.plan = range(schedule.epochs * schedule.minibatches)  # update's j: epoch j // m, minibatch j % m
        if exp.cfg.trainer.steps % len(self.plan):
            raise ConfigError(f"'trainer.steps'={exp.cfg.trainer.steps} is not a multiple of the "
                              f"{len(self.plan)} optimizer steps of a round (epochs x minibatches).")
        self.sharding = batch_sharding(exp.mesh, exp.rules)
        self.feed = Feed(exp.train_batches, self.sharding, exp.cfg.trainer.grad_accum * schedule.minibatches)
        self.hooks = default_hooks(exp, self.feed) if hooks is None else hooks
        self.every = exp.cfg.trainer.log_every
        self.sync = Sync(fixed=self.every if jax.process_count() > 1 else None)
        # rounds of several steps, or scored on the host (which waits for the device anyway): the
        # loop waits at round starts only, so that rows close on a round boundary with its time
        self.round_waits = self.alg.score is not None or len(self.plan) > 1
        self.held: list[tuple[int, dict[str, float], list]] = []  # logging steps' (step, row, takes) until a wait
        self.last: dict[str, jax.Array] | None = None  # step `run.step`'s metrics: what a wait waits on
        self.parts: Parts | None = None
        self.state: TrainState | None = None  # the final state once `run` returns

    def run(self) -> Summary:
        with jax.set_mesh(self.exp.mesh), nnx.logical_axis_rules(self.exp.rules):
            run = self.start()
            try:
                for hook in self.hooks:
                    hook.on_start(run)
                pending = self.feed.read()
                while run.status == RUNNING and not run.done:
                    pending = self._round(run, pending)
                self._wait(run)
                if run.status == RUNNING:
                    run.status = COMPLETED
            except BaseException:
                with suppress(Exception):  # the held rows, if they can still be fetched
                    self._wait(run)
                raise
            finally:
                self.feed.close()
                for hook in self.hooks:
                    hook.on_end(run)
                self.state = run.state
        return Summary.of(run)

    def policy(self) -> nnx.Module:
        """The trained policy (after `run`): the final state merged into the model."""
        return nnx.merge(self.parts.graphdef, self.state.params, self.state.rest).policy

    def _round(self, run: Run, pending: Round) -> Round:
        """One round: collect, score, finalize, the optimizer steps; returns the next round's data."""
        if self.round_waits and (self.held or self.sync.due(run.step)):
            self._wait(run)  # for the previous round's last step
            if run.status != RUNNING:  # a non-finite loss in the rows it completed: no new round
                return pending
        batch, host, run.data_state = pending
        if run.programs.collect_update is not None:  # one program (stack.engine.step.one_program)
            step, extra = (lambda j: run.programs.collect_update(run.state, run.frozen, batch)), {}
            run.tokens_per_step, run.episodes_per_step = self.alg.batch_tokens(batch), 0.0
        else:
            step, extra = self._collected(run, batch, host)
        for j in self.plan:
            run.state, metrics = step(j)
            if j == len(self.plan) - 1:
                pending = self.feed.read(busy=metrics)  # the host reads while the device runs the step
            if not self.round_waits and self.sync.due(run.step):
                self._wait(run)  # for the step before this one, which stays queued
            self.last = metrics
            run.step += 1
            row: dict[str, float] = {}
            for hook in self.hooks:
                hook.after_step(run, {**metrics, **extra}, row)
            if run.step % self.every == 0 or run.done:
                self.held.append((run.step, row, [hook.take(run) for hook in self.hooks]))
            elif row:  # e.g. an eval between logging steps: after the held rows
                self._wait(run)
                run.emit(run.step, row)
        if self.held and any(hook.waits(run) for hook in self.hooks):
            self._wait(run)
        for hook in self.hooks:
            hook.after_round(run)
        return pending

    def _collected(self, run: Run, batch: dict, host: dict) -> tuple[Callable, dict]:
        """Collect, score and finalize a round's data: (its j-th optimizer step j -> (state, metrics),
        finalize's metrics)."""
        xp, scores = self._draw(run, batch, host)
        drawn = {}
        if run.programs.keep is not None:  # more generation batches while `keep` leaves rows out
            (xp, scores), drawn = refill((xp, scores), run.programs.keep, lambda: self._draw(run),
                                         self.alg.schedule.generations)
        xp, algo, extra = run.programs.finalize(xp, scores, run.state.algo)
        extra = {**extra, **drawn}
        run.state = replace(run.state, algo=algo)
        run.tokens_per_step = self.alg.batch_tokens(xp) // self.alg.schedule.minibatches
        run.episodes_per_step = episodes(xp) / len(self.plan)
        return (lambda j: run.programs.update(run.state, run.frozen, xp, j)), extra

    def _draw(self, run: Run, batch: dict | None = None, host: dict | None = None) -> tuple[dict, Any]:
        """A generation batch, collected and scored: of `batch`, or of the next data read (which moves
        the round's data position on)."""
        if batch is None:
            batch, host, run.data_state = self.feed.read()
        state = run.state.models_only()
        if run.programs.interact is not None:  # multi-turn rollouts on the host, before collect
            batch = run.programs.interact(state, batch, host, True)
        xp = run.programs.collect(state, run.frozen, batch, True)
        return xp, self.alg.score(xp, host) if self.alg.score is not None else None

    def _wait(self, run: Run) -> None:
        """Wait for the device to finish step `run.step`, then complete and emit the held rows:
        every hook's `log` on them, then what each row had."""
        if self.last is not None:
            jax.block_until_ready(self.last)
        run.synced = run.step
        self.sync.waited(run.step, run.clock.now())
        held, self.held = self.held, []
        if not held:
            return
        logged: list[dict[str, float]] = [{} for _ in held]
        for i, hook in enumerate(self.hooks):
            hook.log(run, [(out, takes[i]) for out, (_, _, takes) in zip(logged, held, strict=True)])
        for out, (step, row, _) in zip(logged, held, strict=True):
            run.emit(step, {**out, **row})

    def start(self) -> Run:
        """The run's state: restored from the newest checkpoint, or initialised (and precomputed)."""
        exp = self.exp
        parts = self.parts = split_models(exp)
        state = initial_state(exp, parts)
        programs = exp.precompiled and exp.precompiled.programs(parts)  # compiled during the model init
        compiled_before = exp.precompiled.seconds if programs else 0.0
        programs = programs or make_programs(exp, parts, state_shardings(exp, parts))
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state.saved())
        restored = exp.checkpointer.restore(target, columns=self.alg.precomputes) if exp.checkpointer else None
        if restored:
            state = replace(state, **restored.state)
        step = restored.step if restored else 0
        evals = [global_batch([b], self.sharding) for b in exp.eval_batches]
        run = Run(exp, programs, state, parts.frozen, evals, first_step=step + 1, total_steps=exp.cfg.trainer.steps,
                  step=step, synced=step, perf={"precompile_seconds": compiled_before})
        if self.alg.precomputes:  # once per record, or read back; the frozen modules are dropped
            run.columns = restored.columns if restored else precompute_columns(exp, programs, state, parts.frozen)
            batches, evals = attach_columns(exp, run.columns)
            self.feed.use(batches)
            run.eval_batches, run.frozen = [global_batch([b], self.sharding) for b in evals], None
        for sink in exp.sinks:  # rows a killed run logged after its newest checkpoint (all: it saved none)
            sink.rewind(restored.step if restored else -1)
        if restored:
            self.feed.restore(restored.data)
            print(f"resumed from {restored.where}", flush=True)
        return run
