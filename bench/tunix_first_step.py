"""Time to first step, process start -> first optimizer step done: `python -m stack` / a Tunix
0.1.7 `DPOTrainer` script, the tiny DPO config of bench/tunix_dpo.py, each with its defaults.

    ~/venv-tunix/bin/python bench/tunix_first_step.py [--trials 3]     # see bench/tunix_dpo.py for the venv
    ~/venv-tunix/bin/python bench/tunix_first_step.py --quick          # one trial

- stack: the CLI itself (`python -m stack` with CONFIG: tunix_dpo.py's config, one step, no checkpoints):
  imports, composition, build, reading the shipped preference data with Grain, compiling and
  running the first step (the step-0 eval runs after it: stack.engine.trainer.evaluation). Its defaults
  include the persistent compilation cache (`trainer.compilation_cache=auto`, stack.hardware.compile_cache). Each
  trial runs it twice against a new, empty cache root: the first run (compiles everything, fills
  the cache), then the same command again (a rerun). An import hook wraps the Throughput hook's
  `after_step`, which blocks on the first step's metrics; the time is read right after it.
- Tunix: a script doing what a Tunix user writes: import tunix, build its Llama3 policy and a
  reference copy of the same shapes, an Optax chain like stack's AdamW, a `DPOTrainer` with no
  eval, and train one step on stack's first batch (saved beforehand as Tunix's TrainingInput
  arrays: it reads no data files). The time is read in `_post_process_train_step` after
  blocking on the model's state. Tunix sets no persistent cache: its every run is a first run.
Each side compiles with its own defaults: stack's CLI at LLVM -O1 (stack.hardware.cpu_compiler), Tunix's script
with XLA's (-O2; set to -O1 it read 4.7 instead of 5.9 s).
Fresh processes after one untimed process that imports both sides' packages (`warm_imports`),
`JAX_COMPILATION_CACHE_DIR` empty, the order alternating by trial; the clock
starts when the parent starts the process. Printed: the medians and the ratios
stack first run / Tunix and stack rerun / Tunix (goal <= 0.7 for both).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from rows import emit  # bench/ is on sys.path when run as a script
from step_overhead import experiment
from tunix_dpo import overrides, tunix_inputs
from tunix_grpo import SHARD_VARIABLES, flax_flag

CONFIG = [*overrides("tiny", 1), "checkpoint=none", "logger=jsonl"]  # tunix_dpo.py's config, one step
# the environment each side starts from: tunix_files' experiment() adds stack's XLA:CPU flags to this
# process's (stack.hardware.cpu_compiler), which `python -m stack` sets for itself and Tunix's script must not get
ENV = dict(os.environ)

STACK_SIDE = """
import importlib.abc, importlib.machinery, runpy, sys, time

class AtFirstStep(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "stack.engine.trainer.metrics":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            after = module.Throughput.after_step

            def after_step(self, run, metrics, row):
                after(self, run, metrics, row)  # blocks on the first step's metrics
                if run.step == run.first_step:
                    print(f"FIRST_STEP {time.time():.4f}", file=sys.stderr, flush=True)
            module.Throughput.after_step = after_step
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, AtFirstStep())
sys.argv = ["stack", *sys.argv[1:]]
runpy.run_module("stack", run_name="__main__", alter_sys=True)
"""

TUNIX_SIDE = """
import json, sys, time
import numpy as np
import jax
import optax
from flax import nnx
from tunix.models.llama3 import model as llama
from tunix.sft.dpo import dpo_trainer

c = json.load(open(sys.argv[1]))
batch = dict(np.load(sys.argv[2]))
mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
config = llama.ModelConfig(num_layers=c["n_layers"], vocab_size=c["vocab_size"], embed_dim=c["d_model"],
                           hidden_dim=c["d_ff"], num_heads=c["n_heads"], head_dim=c["head_dim"],
                           num_kv_heads=c["n_kv_heads"], rope_theta=c["rope_theta"], norm_eps=c["norm_eps"],
                           weight_tying=c["tie"])
with jax.set_mesh(mesh):
    policy, reference = llama.Llama3(config, rngs=nnx.Rngs(0)), llama.Llama3(config, rngs=nnx.Rngs(0))
schedule = optax.warmup_cosine_decay_schedule(0.0, c["lr"], 20, 200, 0.1 * c["lr"])
tx = optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(b1=0.9, b2=0.95, eps=1e-8),
                 optax.add_decayed_weights(0.1), optax.scale_by_learning_rate(schedule))
training = dpo_trainer.DPOTrainingConfig(eval_every_n_steps=2, max_steps=1, beta=c["beta"], label_smoothing=0.0)
with jax.set_mesh(mesh):
    trainer = dpo_trainer.DPOTrainer(policy, reference, tx, training)
post = trainer._post_process_train_step

def timed(aux):
    post(aux)
    jax.block_until_ready(nnx.state(trainer.model))
    print(f"FIRST_STEP {time.time():.4f}", file=sys.stderr, flush=True)

trainer._post_process_train_step = timed
with jax.set_mesh(mesh):
    trainer.train(iter(lambda: batch, None))
"""


def tunix_files(workdir: str) -> list[str]:
    """Tunix's model shapes, beta and lr (cfg.json) and stack's first batch as its TrainingInput (batch.npz)."""
    with flax_flag(SHARD_VARIABLES):
        exp = experiment(overrides("tiny", 1))
    mc, paths = exp.cfg.model, [os.path.join(workdir, "cfg.json"), os.path.join(workdir, "batch.npz")]
    shapes = dict(n_layers=mc.n_layers, vocab_size=mc.vocab_size, d_model=mc.d_model, d_ff=mc.d_ff,
                  n_heads=mc.n_heads, head_dim=mc.head_dim or mc.d_model // mc.n_heads, n_kv_heads=mc.n_kv_heads,
                  rope_theta=int(mc.rope_theta), norm_eps=mc.norm_eps, tie=mc.tie_embeddings,
                  beta=exp.algorithm.beta, lr=exp.cfg.optimizer.lr)
    with open(paths[0], "w") as f:
        json.dump(shapes, f)
    np.savez(paths[1], **tunix_inputs(exp.eval_batches[0]))
    return paths


def first_step(args: list[str], cwd: str, cache_root: str = "") -> float:
    """Seconds from starting `python -c ...args` to the FIRST_STEP line it prints; `cache_root`:
    stack's cache root (STACK_CACHE_DIR)."""
    env = {"JAX_PLATFORMS": "cpu",  # both sides: no TPU plugin probe where libtpu is installed (stack sets it too)
           **ENV, "JAX_COMPILATION_CACHE_DIR": "", "STACK_CACHE_DIR": cache_root}
    start = time.time()
    out = subprocess.run([sys.executable, "-c", *args], capture_output=True, text=True, env=env, cwd=cwd)
    lines = [line for line in out.stderr.splitlines() if line.startswith("FIRST_STEP ")]
    if out.returncode or not lines:
        raise RuntimeError(f"{args[0][:40]!r}... exited {out.returncode}: {out.stderr[-1500:]}")
    return float(lines[0].split()[1]) - start


def warm_imports(work: str) -> None:
    """One untimed process importing both sides' packages before the trials. Without it the first
    process after this one's start ran slower, and that was always stack's first run (trial 0 runs
    it first): 4.08 / 4.14 / 3.82 s against 3.70 / 3.51 / 3.46 s in trial 1 (three runs of 2
    trials; Tunix the same in both, 5.25-5.45 s). With it: 3.62 / 3.59 against 3.61 / 3.51 s."""
    code = "import jax, flax.nnx, tunix.sft.dpo.dpo_trainer, stack.cli.app, stack.run.modes"
    subprocess.run([sys.executable, "-c", code], env={**ENV, "JAX_PLATFORMS": "cpu"}, cwd=work, check=True,
                   capture_output=True)


def stack_runs(work: str) -> tuple[float, float]:
    """(first run, rerun) of `python -m stack` against a new, empty cache root."""
    root = tempfile.mkdtemp(dir=work)
    runs = [first_step([STACK_SIDE, *CONFIG, f"run_dir={tempfile.mkdtemp(dir=work)}"], work, root) for _ in range(2)]
    return runs[0], runs[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one trial")
    args = parser.parse_args()
    first, rerun, theirs = [], [], []
    with tempfile.TemporaryDirectory() as work:
        tunix = [TUNIX_SIDE, *tunix_files(work)]
        warm_imports(work)
        for trial in range(1 if args.quick else args.trials):
            if trial % 2:
                theirs.append(first_step(tunix, work))
            first_run, again = stack_runs(work)
            first.append(first_run)
            rerun.append(again)
            if not trial % 2:
                theirs.append(first_step(tunix, work))
            print(f"  stack first run {first_run:.2f} s, rerun {again:.2f} s; tunix {theirs[-1]:.2f} s", flush=True)
    f, r, t = (statistics.median(x) for x in (first, rerun, theirs))
    print(f"tiny DPO, process start -> first step done: medians stack first run {f:.2f} s, rerun {r:.2f} s, "
          f"tunix {t:.2f} s | first run / tunix {f / t:.3f}, rerun / tunix {r / t:.3f} (goal <= 0.7)")
    emit("time to first step, first run: stack / Tunix (tiny DPO)", f / t, "<= 0.7")
    emit("time to first step, rerun: stack / Tunix (tiny DPO)", r / t, "<= 0.7")


if __name__ == "__main__":
    main()
