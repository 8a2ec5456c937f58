"""stack: config-driven training and post-training of language models on the JAX AI stack.

A run: `cli` (the Hydra entry) -> `config` (compose, validate) -> `run.build` (config ->
`engine.Experiment`) -> `engine.trainer` (rounds of `engine.step`'s jitted programs).

Rules of the house: packages stand on floors, lowest first; a package imports only packages on
floors below its own, never one on its own floor, so nothing imports upward and no cycle forms:

    errors                         the error types every floor raises
    config                         schemas, validation, the _target_ allow-list, HF config mapping (no jax)
    hardware                       targets, FLOP/s, mesh and logical axes, compiler/cache/host knobs, workers
    models  data  optim  logging   decoders, Grain pipelines, the Optax chain, metric sinks
    quant  rollout                 the Qwix provider; sampling with a KV cache
    checkpoint                     Orbax managers, saved params, a run's policy, run-dir lock, job status
    rewards                        rule functions, their workers, a reward model, multi-turn environments
    algorithms                     sft dpo rm grpo ppo (+ multi-turn rollouts); base.py is the protocol
    engine                         Experiment, step, aot (mode=compile), precompile/precompute, trainer
    launch                         local processes, SLURM, cloud, sweeper, report, the Hydra job
    run                            build (config -> Experiment), modes, warm start
    tools                          generate, hf export, quantize, the recipes catalogue
    cli                            the Hydra entry (`__main__.py` defines `main`), the Python API (`stack.train`, ...)

`engine` knows `algorithms.base`, never a concrete algorithm; `models` import no config (no
omegaconf, no schema). An import inside a function keeps a heavy import off a light path and
says so. tests/unit/test_design.py enforces these rules on the source.
"""

import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec

from stack.errors import ModuleMoved, moved_to


class MovedModules(MetaPathFinder):
    """Last on `sys.meta_path`: asked only for a `stack.*` module no other finder has, it answers
    an old path (stack 0.1's, `import stack.build`, `python -m stack.hf`) with the new one."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        new = moved_to(name) if name.startswith("stack.") else None
        if new is not None:
            raise ModuleMoved(f"No module named {name!r}: it moved to {new!r} when stack/ became layered "
                              "packages (stack 0.2); import or run that instead.", name=name)
        return None


if not any(isinstance(f, MovedModules) for f in sys.meta_path):
    sys.meta_path.append(MovedModules())


API = ("compose", "load_recipe", "train", "generate", "export_hf")


def __getattr__(name: str) -> object:
    """`stack.compose` and the rest of the API (stack.cli.api), imported at first use."""
    if name in API:
        from stack.cli import api  # Hydra and the tools: only when the API is used, not on `import stack`

        return getattr(api, name)
    raise AttributeError(f"module 'stack' has no attribute {name!r}")
