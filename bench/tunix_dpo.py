"""Seconds per DPO step: stack's trainer vs Google Tunix 0.1.7's DPOTrainer, same process.

    python3.11 -m venv ~/venv-tunix && ~/venv-tunix/bin/pip install -e '.[dev]' google-tunix==0.1.7
    ~/venv-tunix/bin/python bench/tunix_dpo.py --trials 3      # --steps 200 --warmup 2 --chunk 10

Tunix is not a dependency of stack: run this from a separate venv that has both (see
bench/tunix_grpo.py). The config is the tiny one of bench/dpo_step.py: Llama, 2 layers,
d_model 64, 4 heads / 2 KV heads, d_ff 176, vocab 384 (untied), byte tokenizer, fp32, no remat,
16 preference pairs of recipes/data/prefs_train.jsonl per step (one fixed batch: stack's first
eval batch, as in dpo_step.py), rows of 64 tokens, sigmoid loss, beta 0.1 (conf/algorithm/dpo.yaml),
label smoothing 0, the same Optax chain (stack's AdamW, built per trial and given to both sides).
Neither side evaluates or saves checkpoints.

- stack: the real trainer (`Trainer`, its default hooks less the eval one) fed the fixed batch
  (step_overhead.Fixed): one round = one step = the frozen reference's forward (`collect`) and
  the policy's forward + backward on chosen and rejected in one pass. Again with
  `data.max_completion_len=8` (the shipped completions have <= 7 loss tokens: nothing is cut):
  policy and reference run the output head at each row's 8 completion positions only, not at
  all 64 (second row). Again with `data.share_prompt=true` as well: each pair is one row of 72
  tokens, the prompt once and both completions after it (stack.data.shared_prompt), 16 rows in
  place of 32 (third row). Again with `algorithm.precompute_reference=true`: the reference
  log-probs are computed once before training and the step has no reference forward (fourth
  row). A hook blocks on the params and reads the trainer's clock (wall time less logging
  pauses) every `--chunk` steps.
- Tunix: `DPOTrainer` with its own Llama3 module of the same shapes (the policy, and a second
  copy, same init, as the reference) on a 1x1 ('fsdp', 'tp') CPU mesh, fed the same token ids
  as a `TrainingInput` dict: each pair's prompt (stack's inputs up to the first completion
  token) left-padded to the batch's longest prompt P, chosen and rejected completions (stack's
  targets under the loss mask) right-padded to 64 - P, so its 32 rows are 64 wide as stack's.
  Its step: `_prepare_inputs` (concatenation, [32, 64, 64] attention mask and positions, the
  reference's jitted forward: every step) and the jitted train step. Its
  `_post_process_train_step` (right after each step) is wrapped to block on the params and read
  the clock every `--chunk` steps.
Both: the first `--warmup` steps (compilation) are dropped; a trial's seconds per step is the
median over the chunks (each chunk: its time / `--chunk`; with 1, every step blocks).
Trials alternate (stack, the two layouts, precomputed reference, Tunix, ...); the medians over
trials and the ratios are printed.

Caveats: the work is the same (32 rows x 64 tokens of policy forward + backward and of reference
forward, chosen and rejected in one batch each; less in the head-cut and shared rows), not its
form: stack masks attention by segment ids, Tunix by a [B, T, T] mask that it builds every step
outside its jitted step, op by op (as the concatenations and positions); Tunix takes the
log-softmax over the 64 - P completion positions only, after its head ran at all 64 (stack: head
and log-softmax at all 64, masked; at 8 with max_completion_len). Tunix's loop also reads the
previous step's loss back every step (its metrics buffer) and updates a progress bar; stack reads
back only at logging steps (here its first and last; the bench's clock reads block both sides
every `--chunk` steps). The weights differ (Tunix's Llama3 has its own init), not the work.
Importing tunix sets flax's `flax_always_shard_variable` to False process-wide; it is restored for
stack's trials.
Timings on a 2-core shared CPU are noisy (±15 %).
"""

import argparse
import statistics
import time
from dataclasses import replace
from importlib.metadata import version
from typing import Any

import flax
import jax
import numpy as np
from dpo_step import PAIRS  # bench/ is on sys.path when run as a script
from dpo_step import SIZES as DPO_SIZES
from flax import nnx
from rows import emit
from step_overhead import Fixed, experiment
from tunix_grpo import SHARD_VARIABLES, flax_flag, tunix_model

from stack.engine.trainer import Trainer
from stack.engine.trainer.context import Hook, Run
from stack.engine.trainer.evaluation import Evaluation

SIZES = {size: [o for o in DPO_SIZES[size] if not o.startswith("trainer.steps=")]
         + ["data=jsonl_prefs", "algorithm=dpo", f"data.batch_size={PAIRS[size]}"] for size in ("tiny",)}
PRECOMPUTED = "algorithm.precompute_reference=true"
HEAD_CUT = "data.max_completion_len=8"  # every shipped completion has <= 7 loss tokens: nothing is cut
SHARED = "data.share_prompt=true"  # with HEAD_CUT: one 72-token row per pair, the prompt once
VARIANTS = {"stack": (), HEAD_CUT: (HEAD_CUT,), SHARED: (HEAD_CUT, SHARED), "precompute_reference": (PRECOMPUTED,)}


def overrides(size: str, steps: int, *extra: str) -> list[str]:
    """dpo_step.py's config of `size` for `steps` steps, without checkpoints (Tunix saves none)."""
    return [*SIZES[size], f"trainer.steps={steps}", "checkpoint.every=0", *extra]


def marks(steps: int, warmup: int, chunk: int) -> list[int]:
    """The steps after which the clock is read (blocking on the params): warmup, +chunk, ..."""
    return list(range(warmup, steps + 1, chunk))


def per_step(ends: list[float], chunk: int) -> float:
    """The median over chunks of seconds per step."""
    return statistics.median(np.diff(ends) / chunk)


class StepClock(Hook):
    """The trainer's clock (wall time less logging pauses) after the steps `at`, once each has finished."""

    def __init__(self, at: list[int]) -> None:
        self.at, self.ends = set(at), []

    def after_step(self, run: Run, metrics: dict[str, jax.Array], row: dict[str, float]) -> None:
        if run.step in self.at:
            jax.block_until_ready(run.state.params)
            self.ends.append(run.clock.now())


def stack_step(size: str, steps: int, warmup: int, chunk: int, *extra: str) -> float:
    """stack's seconds per DPO step: the real trainer on dpo_step.py's fixed batch."""
    clock = StepClock(marks(steps, warmup, chunk))
    with flax_flag(SHARD_VARIABLES):
        exp = experiment(overrides(size, steps, *extra))
        trainer = Trainer(replace(exp, train_batches=Fixed(exp.eval_batches[0])))
        trainer.hooks = [h for h in trainer.hooks if not isinstance(h, Evaluation)] + [clock]  # Tunix runs no eval
        trainer.run()
    assert len(clock.ends) == len(clock.at), clock.ends
    return per_step(clock.ends, chunk)


def padded(rows: list[np.ndarray], width: int, left: bool) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask) [len(rows), width] int32, each row padded with 0 on the left or the right."""
    ids, mask = np.zeros((len(rows), width), np.int32), np.zeros((len(rows), width), np.int32)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, span], mask[i, span] = row, 1
    return ids, mask


def tunix_inputs(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    """stack's pair batch ([B, 2, T] inputs/targets/loss_mask) as Tunix's DPO TrainingInput fields,
    rows as wide as stack's: prompts left-padded to the longest P, completions right-padded to T - P."""
    inputs, targets, mask = (np.asarray(batch[k]) for k in ("inputs", "targets", "loss_mask"))
    first = mask.argmax(-1)  # [B, 2]: the position whose target is the first completion token
    prompts = [inputs[b, 0, :f + 1] for b, f in enumerate(first[:, 0])]
    assert all((inputs[b, 1, :f + 1] == p).all() for b, (p, f) in enumerate(zip(prompts, first[:, 1], strict=True))), \
        "chosen and rejected rows of a pair must share the prompt"
    completions = [[targets[b, s][mask[b, s] > 0] for b in range(len(inputs))] for s in (0, 1)]
    width = inputs.shape[-1]
    longest = max(map(len, prompts))
    assert max(len(c) for side in completions for c in side) <= width - longest, "a pair does not fit in T"
    prompt_ids, prompt_mask = padded(prompts, longest, left=True)
    chosen_ids, chosen_mask = padded(completions[0], width - longest, left=False)
    rejected_ids, rejected_mask = padded(completions[1], width - longest, left=False)
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "chosen_ids": chosen_ids,
            "chosen_mask": chosen_mask, "rejected_ids": rejected_ids, "rejected_mask": rejected_mask}


def tunix_trainer(exp: Any, steps: int) -> tuple[Any, jax.sharding.Mesh]:
    """A Tunix DPOTrainer for `exp`'s model shapes, beta, label smoothing and Optax chain."""
    from tunix.sft.dpo import dpo_trainer

    alg = exp.algorithm
    assert alg.loss_types == ("sigmoid",) and not alg.sft_weight, "Tunix's DPO loss is sigmoid only"
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    config = dpo_trainer.DPOTrainingConfig(eval_every_n_steps=steps + 1, max_steps=steps, beta=alg.beta,
                                           label_smoothing=alg.label_smoothing)
    policy, reference = tunix_model(exp.cfg.model, mesh), tunix_model(exp.cfg.model, mesh)  # same init
    with jax.set_mesh(mesh):
        return dpo_trainer.DPOTrainer(policy, reference, exp.tx, config), mesh


def tunix_step(size: str, steps: int, warmup: int, chunk: int) -> float:
    """Tunix's seconds per DPO step on stack's fixed batch, read as stack's (StepClock)."""
    with flax_flag(SHARD_VARIABLES):
        exp = experiment(overrides(size, steps))  # for its config, Optax chain and batch; its model is unused
    batch, at, ends = tunix_inputs(exp.eval_batches[0]), set(marks(steps, warmup, chunk)), []
    with flax_flag(False):  # what importing tunix sets
        trainer, mesh = tunix_trainer(exp, steps)
        post = trainer._post_process_train_step  # runs right after each train step

        def timed(aux: Any) -> None:
            post(aux)
            if trainer.iter_steps + 1 in at:  # iter_steps: the steps done before this one
                jax.block_until_ready(nnx.state(trainer.model))
                ends.append(time.perf_counter())

        trainer._post_process_train_step = timed
        with jax.set_mesh(mesh):
            trainer.train(iter(lambda: batch, None))
    assert trainer.iter_steps == steps and len(ends) == len(at), (trainer.iter_steps, ends)
    return per_step(ends, chunk)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per trial and side")
    parser.add_argument("--warmup", type=int, default=2, help="first steps dropped (compilation)")
    parser.add_argument("--chunk", type=int, default=10, help="steps between clock reads (1: block every step)")
    args = parser.parse_args()
    if args.warmup < 1 or args.chunk < 1 or args.steps < args.warmup + args.chunk:
        parser.error("need --warmup >= 1, --chunk >= 1 and --steps >= --warmup + --chunk")
    print(f"jax {jax.__version__}, flax {flax.__version__}, tunix {version('google-tunix')} on "
          f"{jax.devices()[0].platform}; {args.trials} alternating trials of {args.steps} steps, the first "
          f"{args.warmup} dropped, the median over chunks of {args.chunk} steps")
    for size in args.sizes:
        times = {name: [] for name in (*VARIANTS, "tunix")}
        for _ in range(args.trials):
            for name, extra in VARIANTS.items():
                times[name].append(stack_step(size, args.steps, args.warmup, args.chunk, *extra))
            times["tunix"].append(tunix_step(size, args.steps, args.warmup, args.chunk))
            print("  trial: " + ", ".join(f"{k} {v[-1] * 1e3:.2f} ms" for k, v in times.items()), flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{size}: medians " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in med.items()) + " per step | "
              + ", ".join(f"{k}/tunix {med[k] / med['tunix']:.3f}" for k in VARIANTS) + " (goal <= 0.85)")
        emit(f"stack / Tunix DPO step ({size})", med["stack"] / med["tunix"], "<= 0.85")
        emit(f"stack / Tunix DPO step, {HEAD_CUT} ({size})", med[HEAD_CUT] / med["tunix"], "<= 0.85")
        emit(f"stack / Tunix DPO step, {HEAD_CUT} {SHARED} ({size})", med[SHARED] / med["tunix"], "<= 0.85")
        emit(f"stack DPO step (precomputed reference) / Tunix DPO step ({size})",
             med["precompute_reference"] / med["tunix"], "<= 0.85")


if __name__ == "__main__":
    main()
