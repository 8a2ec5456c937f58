"""Orbax checkpoint tiers and resume.

One checkpoint step holds everything a resume needs: `state` (the TrainState's trained
params, optimizer state, algorithm state, step and PRNG key, as sharded in training; see
stack.engine.step), `data` (the Grain iterator state before the next batch was read) and
`meta` (step, the checkpoint format, the resolved config, the math-relevant keys as composed,
the wandb run id) and, where the algorithm precomputes per-record values before training,
`columns` (those tables, so a resume never recomputes them from a policy that has moved).
Saves are async (the caller waits only for the device-to-host copy; stack.engine.trainer.save_overlap
moves even that off the loop); Orbax finalises a step atomically, so a step killed mid-save
is never listed. Restore tries the newest step across all tiers and falls
back to older ones with a warning when a step cannot be read; it never restarts from
scratch while checkpoints exist.
"""

import glob
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from omegaconf import DictConfig, OmegaConf

from stack.checkpoint.errors import aborted_write, check_format, quiet_failed_reads, writing
from stack.checkpoint.saved_params import checkpoints_of
from stack.errors import ConfigError, RunDirRefused

# Config keys whose change would make a resumed run compute something else; the rest
# (trainer.steps, logging, eval, checkpoint cadence, mesh, data loading threads) may change.
FIXED_KEYS = ("model", "algorithm", "optimizer", "quantization", "data", "seed", "trainer.grad_accum")
# (data.workers is not free: Grain gives each worker process its own slice of the records and
# batches them there, so the worker count decides which records form a batch.)
FREE_DATA_KEYS = ("read_threads", "prefetch")
FREE_KEYS = ("optimizer.schedule.total_steps",  # follows trainer.steps
             "model.remat", "model.scan_layers",  # how the step computes, not what it computes
             "model.init_from")  # where step 0's params came from: a resume restores its own
# 2: the state is a TrainState (params under `policy/`, step, key, algorithm state; gradient
# accumulation inside the step). 1 (no `format` in meta): params + optax.MultiSteps state.
FORMAT = 2


@dataclass
class Tier:
    name: str
    path: str
    every: int
    manager: ocp.CheckpointManager
    pending: int | None = None  # the step of the last save started (async saves finish later)


@dataclass
class Restored:
    step: int
    state: Any  # the TrainState's saved fields, laid out like the abstract target
    data: dict[str, Any]  # the data iterator state
    meta: dict[str, Any]
    where: str
    columns: dict[str, Any] | None = None  # precomputed per-record tables, where saved


def _manager(path: str, keep: int, async_save: bool) -> ocp.CheckpointManager:
    """The manager of a tier this run writes (a killed save's leftovers are removed first)."""
    for tmp in glob.glob(os.path.join(path, "*.orbax-checkpoint-tmp*")):
        if jax.process_index() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
    return ocp.CheckpointManager(os.path.abspath(path) if "://" not in path else path, options=options)


def math_config(cfg: DictConfig) -> dict[str, Any]:
    """The keys of `cfg` that a resume must not change (unresolved: `${trainer.steps}` stays)."""
    out = {}
    for key in FIXED_KEYS:
        node = OmegaConf.select(cfg, key)
        out[key] = OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node
    for key in FREE_DATA_KEYS:
        out["data"].pop(key, None)
    for key in FREE_KEYS:
        group, _, rest = key.partition(".")
        node = out.get(group)
        *parents, leaf = rest.split(".")
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return out


ABSENT = "<absent>"  # a key one side of config_diff lacks


def config_diff(saved: Any, now: Any, prefix: str = "") -> list[str]:
    """`key: saved -> now` for every leaf that differs. A key only one side has counts as unchanged
    while it is null, false or "none" there: an option added to (or dropped from) stack since the save,
    off, computes what the run computed (recipes.config_changes's rule), so an upgrade of stack
    does not strand a run (before, every new key refused the resume of older checkpoints)."""
    if isinstance(saved, dict) and isinstance(now, dict):
        return [line for k in sorted(set(saved) | set(now))
                for line in config_diff(saved.get(k, ABSENT), now.get(k, ABSENT), f"{prefix}{k}.")]
    if saved is ABSENT or now is ABSENT:
        there = now if saved is ABSENT else saved
        if isinstance(there, dict):  # a group added or dropped: its keys one by one
            return config_diff({} if saved is ABSENT else saved, {} if now is ABSENT else now, prefix)
        if there is None or there is False or there == "none":  # "none": a group's option that is off
            return []
    return [] if saved == now else [f"{prefix.rstrip('.')}: {saved!r} -> {now!r}"]


class Checkpointer:
    """The tiers of the `checkpoint` group for one run."""

    def __init__(self, cfg: DictConfig, run_dir: str):
        c = cfg.checkpoint
        self.cfg, self.resume = cfg, c.resume
        self.tiers: list[Tier] = []
        if c.name != "none":
            path = c.path or os.path.join(run_dir, "checkpoints")
            self.tiers.append(Tier(c.name, path, c.every, _manager(path, c.keep, c.async_save)))
            if c.persistent is not None and c.persistent.path:
                p = c.persistent
                self.tiers.append(Tier("persistent", p.path, p.every, _manager(p.path, p.keep, c.async_save)))
        sys.unraisablehook = aborted_write
        self._other: ocp.CheckpointManager | None = None  # resume=PATH: another run's dir, read only
        if self.resume not in ("auto", "never"):
            self.resume = self._other_run(self.resume)

    def _other_run(self, path: str) -> str:
        """checkpoint.resume=PATH: another run's checkpoints dir (or its run dir), read only; it must
        hold a complete step (a resume that finds none is an error, not a fresh start)."""
        path = checkpoints_of(path)
        if not os.path.isdir(path) and "://" not in path:
            raise ConfigError(f"'checkpoint.resume'={path!r}: no such checkpoint directory "
                              "(use auto, never, or a run's dir or its checkpoints dir).")
        self._other = ocp.CheckpointManager(os.path.abspath(path) if "://" not in path else path,
                                            options=ocp.CheckpointManagerOptions(read_only=True))
        if not self._other.all_steps():
            raise ConfigError(f"'checkpoint.resume'={path!r} holds no complete checkpoint step, so there is nothing "
                              "to resume from; give a run's dir or its checkpoints dir, or resume=auto to start fresh.")
        return path

    @cached_property
    def _configs(self) -> dict[str, Any]:
        """The meta's config items (once: resolving the config takes ~60 ms)."""
        return {"config": math_config(self.cfg), "resolved_config": OmegaConf.to_container(self.cfg, resolve=True)}

    def save(self, step: int, state: Any, data: dict[str, Any], meta: dict[str, Any],
             tiers: list[Tier] | None = None, block: bool = False, columns: dict[str, Any] | None = None) -> None:
        """Save to `tiers` (default: all); async unless `block`."""
        meta = {**meta, "step": step, "format": FORMAT, **self._configs}
        for tier in self.tiers if tiers is None else tiers:
            if step in tier.manager.all_steps():
                continue  # e.g. the final step that was also a cadence step
            items = dict(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data), meta=ocp.args.JsonSave(meta))
            if columns is not None:
                items["columns"] = ocp.args.StandardSave(columns)
            with writing(tier, tier.pending):  # the previous async save: its error surfaces here
                tier.manager.wait_until_finished()
            tier.pending = step
            with writing(tier, step):
                tier.manager.save(step, args=ocp.args.Composite(**items))
                if block:
                    tier.manager.wait_until_finished()

    def _sources(self) -> list[tuple[str, ocp.CheckpointManager]]:
        if self.resume == "never":
            for tier in self.tiers:
                if tier.manager.all_steps():
                    raise RunDirRefused(
                        f"'checkpoint.resume'=never but {tier.path} already holds steps "
                        f"{tier.manager.all_steps()}; use a new run dir or checkpoint.path, or resume=auto."
                    )
            return []
        if self.resume == "auto":
            return [(t.path, t.manager) for t in self.tiers]
        return [(self.resume, self._other)]

    def _candidates(self) -> list[tuple[int, str, ocp.CheckpointManager]]:
        """(step, path, manager) of every complete step across the sources, newest first."""
        found = [(step, path, m) for path, m in self._sources() for step in m.all_steps()]
        return sorted(found, key=lambda c: c[0], reverse=True)

    def restore(self, abstract_state: Any, columns: bool = False) -> Restored | None:
        """The newest readable step across the tiers (None: nothing to resume from).

        `columns`: also read the precomputed tables (numpy, as saved).
        """
        errors = []
        for step, path, manager in self._candidates():
            try:
                meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
                check_format(meta, f"{path}/{step}", FORMAT)  # an old layout or a changed config is an
                self._check_config(meta, f"{path}/{step}")  # error, not a bad step
                items = dict(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore(),
                             meta=ocp.args.JsonRestore())
                if columns:
                    items["columns"] = ocp.args.StandardRestore()
                r = manager.restore(step, args=ocp.args.Composite(**items))
            except ConfigError:
                raise
            except Exception as exc:  # a truncated or deleted file: try the previous step
                quiet_failed_reads()  # the step's other reads die later, each with a traceback at exit
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                reason = reason.split(" See full TensorStore details")[0][:300]  # the rest is a repr
                warnings.warn(f"checkpoint step {step} in {path} cannot be restored ({reason}); "
                              "trying the previous one", RuntimeWarning, stacklevel=2)
                errors.append(f"step {step} in {path}: {reason}")
                continue
            tables = jax.tree.map(np.asarray, r.columns) if columns else None
            return Restored(step, r.state, r.data, r.meta, f"{path}/{step}", tables)
        if errors:
            raise ConfigError(
                f"Checkpoints exist but none can be restored ({'; '.join(errors)}). Not restarting from "
                "scratch: delete the broken steps (or the whole checkpoints dir to start over), or set "
                "checkpoint.resume=never with a new run dir."
            )
        return None

    def _check_config(self, meta: dict[str, Any], where: str) -> None:
        diff = config_diff(meta.get("config", {}), math_config(self.cfg))
        if diff:
            start = "" if any(d.startswith("model.") for d in diff) else \
                f", with model.init_from={os.path.dirname(where)} to start from these weights"
            raise ConfigError(
                f"The config differs from the one checkpoint {where} was trained with, in keys that "
                f"change the math: {'; '.join(diff)}. Restore those values to resume, or start a new "
                f"run dir{start}. A resume may change trainer.steps, logging, eval and checkpoint cadence."
            )

    def latest_meta(self) -> dict[str, Any] | None:
        """The `meta` of the newest readable step, its layout and config checked against this run's
        (read in `build`, before the loggers and before the run dir's config.yaml is replaced, so a
        run that cannot resume writes nothing; the meta holds the wandb id)."""
        for step, path, manager in self._candidates():
            try:
                meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
            except Exception:
                continue
            try:
                check_format(meta, f"{path}/{step}", FORMAT)
                self._check_config(meta, f"{path}/{step}")
            except ConfigError as exc:
                raise RunDirRefused(str(exc)) from None
            return meta
        return None

    def close(self) -> None:
        """Wait for pending async saves, then release the managers."""
        for tier in self.tiers:
            try:
                with writing(tier, tier.pending):
                    tier.manager.wait_until_finished()
            finally:
                tier.manager.close()
        if self._other is not None:
            self._other.close()
