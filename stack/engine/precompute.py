"""Per-record columns computed once before training (`algorithm.precomputes`).

When what an algorithm's `collect` adds depends only on its frozen modules and the record
(DPO's reference log-probs with `algorithm.precompute_reference=true`), the trainer runs
`collect` once over every training record, in source order, and over the eval batches. The
new columns are attached to the data (each row carries its record's entries whatever the
shuffle order, `Batches.with_columns`), saved in every checkpoint next to the data state,
and the frozen modules are dropped: `collect` passes such batches through.
"""

import time
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from stack.data.pipeline import Batches
from stack.engine.experiment import Experiment
from stack.errors import ConfigError
from stack.hardware.mesh import batch_sharding, global_batch

IN_FLIGHT = 4  # batches of the first pass dispatched ahead of the one the host waits for


def _added(programs: Any, state: Any, frozen: Any, batch: dict[str, np.ndarray], sharding: Any,
           train: bool) -> dict[str, jax.Array]:
    """The columns `collect` adds to one host batch, per row ([rows, ...])."""
    device, _ = global_batch([batch], sharding)
    xp = programs.collect(state.models_only(), frozen, device, train)
    return {k: v[0] for k, v in xp.items() if k not in device}


def precompute_columns(exp: Experiment, programs: Any, state: Any, frozen: Any) -> dict[str, dict[str, np.ndarray]]:
    """{"train": {name: [records, ...]}, "eval": {name: [eval batches, global rows, ...]}} from the
    initial model, the same tables on every process.

    Several processes: each reads every record in source order and feeds every P-th batch (its
    turn in each group of P); the added columns of every process's rows are gathered to all.
    """
    start, sharding, me = time.perf_counter(), batch_sharding(exp.mesh, exp.rules), jax.process_index()
    pending = []
    for group in turns(exp.train_batches.ordered(), jax.process_count()):
        batch = group[me][1] if me < len(group) else group[0][1]  # past the last batch: rows nobody keeps
        pending.append(([indices for indices, _ in group], _added(programs, state, frozen, batch, sharding, True)))
        if len(pending) > IN_FLIGHT:  # bounded: XLA:CPU collectives stall with hundreds queued
            jax.block_until_ready(pending[-IN_FLIGHT][1])
    train: dict[str, np.ndarray] = {}
    rows = exp.train_batches.batch_size  # one process's rows of each global batch
    for (group, _), out in zip(pending, everywhere([o for _, o in pending]), strict=True):
        for name, value in out.items():
            if name not in train:  # NaN marks records that were skipped as bad
                train[name] = np.full((exp.train_batches.records, *value.shape[1:]), np.nan, value.dtype)
            for turn, indices in enumerate(group):
                train[name][indices] = value[turn * rows:turn * rows + len(indices)]
    evals = everywhere([_added(programs, state, frozen, b, sharding, False) for b in exp.eval_batches])
    print(f"precomputed {', '.join(train)} for {exp.train_batches.records} records in "
          f"{time.perf_counter() - start:.1f}s", flush=True)
    return {"train": train, "eval": {name: np.stack([e[name] for e in evals]) for name in evals[0]}}


def turns(batches: Iterator[Any], n: int) -> Iterator[list[Any]]:
    """`batches` in groups of `n` (the last may be shorter): one global batch of n processes each."""
    group = []
    for item in batches:
        group.append(item)
        if len(group) == n:
            yield group
            group = []
    if group:
        yield group


def everywhere(tree: Any) -> Any:
    """Global arrays as numpy with every process's rows, on every process."""
    return jax.device_get(tree) if jax.process_count() == 1 else multihost_utils.process_allgather(tree, tiled=True)


def attach_columns(
    exp: Experiment, columns: dict[str, dict[str, np.ndarray]]
) -> tuple[Batches, list[dict[str, np.ndarray]]]:
    """`exp`'s train pipeline and eval batches with the precomputed columns attached."""
    saved = min((len(table) for table in columns["eval"].values()), default=0)
    if saved < len(exp.eval_batches):  # a resume with more eval batches than were precomputed
        raise ConfigError(
            f"'trainer.eval_batches'={len(exp.eval_batches)} but the checkpoint's precomputed columns cover "
            f"{saved} eval batches (the reference is gone after step 0); set trainer.eval_batches<={saved}.")
    me, evals = jax.process_index(), []
    for i, b in enumerate(exp.eval_batches):
        n = len(next(iter(b.values())))  # this process's rows; the tables hold every process's, in order
        evals.append({**b, **{name: table[i][me * n:(me + 1) * n] for name, table in columns["eval"].items()}})
    return exp.train_batches.with_columns(columns["train"]), evals
