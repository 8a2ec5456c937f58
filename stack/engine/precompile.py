"""Compile the first round's program while the model initialises (time to first step).

A run's programs (stack.engine.step.make_programs) depend on the shapes and shardings of the state,
not on its values. So `build` hands a shape-only Experiment to a thread that makes the programs
for it (stack.engine.aot.abstract_run, as `mode=compile` does) and AOT-compiles the round's one
program (DPO's `collect_update`, SFT/RM's `update`) while the main thread initialises the model
(XLA's compile releases the GIL). The trainer then runs those same jitted functions: its first
call finds the executable in jax's in-memory cache (same function, same input types and
shardings), so nothing compiles in front of the first step (bench/tunix_first_step.py). The
gain is bounded on CPU: the compile and the initialisation share the cores.

Only where that is safe and the same program by construction: one process, `quantization=none`
(Qwix rewrites the model through global interception), an algorithm whose round is one program
or that has no `collect` (GRPO/PPO's setup writes to the algorithm object). The programs are
taken only when the real model's graph equals the shape-only one's (then merging the real state
into either is the same module); any failure here leaves the trainer to make its own programs,
where a genuine error is raised again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import jax
from flax import nnx

from stack.engine.aot import abstract_run
from stack.engine.step import Parts, Programs, one_program
from stack.quant.providers import NoQuantization

if TYPE_CHECKING:  # the experiment holds its Precompile
    from stack.engine.experiment import Experiment


def eligible(exp: Experiment) -> bool:
    """Whether `exp`'s first program can be compiled beside the model init (module docstring)."""
    alg = exp.algorithm
    return (jax.process_count() == 1 and isinstance(exp.quant, NoQuantization)
            and (one_program(alg) or (alg.collect is None and alg.score is None and alg.finalize is None)))


class Precompile:
    """The programs of a shape-only Experiment, their round's program compiled in a thread."""

    def __init__(self, exp: Experiment, policy: Callable[[], nnx.Module]) -> None:
        self._exp, self._policy = exp, policy
        self._programs: Programs | None = None
        self._graphs: tuple[Any, Any] | None = None
        self.seconds = 0.0  # the thread's wall time: shape-only build, trace, lower, compile (or cache load)
        self._thread = threading.Thread(target=self._compile, name="stack-precompile")
        self._thread.start()

    def _compile(self) -> None:
        start = time.perf_counter()
        try:
            with jax.set_mesh(self._exp.mesh), nnx.logical_axis_rules(self._exp.rules):
                exp = replace(self._exp, model=self._policy())
                r = abstract_run(exp)
                if r.programs.collect_update is not None:
                    r.programs.collect_update.lower(r.state, r.frozen, r.batch).compile()
                else:
                    r.programs.update.lower(r.state, r.frozen, r.xp, 0).compile()
        except Exception:  # noqa: BLE001  the trainer compiles on its own; a real error recurs there
            return
        self._programs, self._graphs = r.programs, (r.parts.graphdef, r.parts.frozen_graphdef)
        self.seconds = time.perf_counter() - start

    def programs(self, parts: Parts) -> Programs | None:
        """The compiled programs if `parts` (the real model's) has the same graphs, else None."""
        self._thread.join()
        if self._graphs != (parts.graphdef, parts.frozen_graphdef):
            return None
        return self._programs


def start(exp: Experiment, policy: Callable[[], nnx.Module]) -> Precompile | None:
    """A Precompile for `exp` with its model `policy()` (shape-only, built in the thread under the
    mesh) when `exp` is `eligible`; else None."""
    return Precompile(exp, policy) if eligible(exp) else None
