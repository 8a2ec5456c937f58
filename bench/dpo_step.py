"""DPO step time over SFT step time on the same number of sequences, same process.

    python bench/dpo_step.py                 # tiny and medium
    python bench/dpo_step.py --sizes tiny
    python bench/dpo_step.py --quick         # tiny, one trial, no precomputed-reference run

Both run the real trainer (`stack.engine.trainer.Trainer`) fed one fixed batch: SFT on 2B
sequences, DPO on B preference pairs (policy forward + backward on chosen and rejected in
one pass, plus the frozen reference's forward in the round's `collect`). By FLOPs the floor is 1.33
(a reference forward is ~1/3 of a training step); the goal is <= 1.4. With
`algorithm.precompute_reference=true` the reference pass is gone from the step (floor 1.0).
"""

import statistics
from dataclasses import replace

from rows import emit  # bench/ is on sys.path when run as a script
from step_overhead import Fixed, bench_args, experiment, ours

SIZES = {
    "tiny": ["model=llama_tiny", "data.seq_len=64", "trainer.steps=200"],
    "medium": ["model.d_model=512", "model.n_layers=4", "model.n_heads=8", "model.n_kv_heads=4",
               "model.d_ff=1408", "data.seq_len=256", "trainer.steps=10"],
}
PAIRS = {"tiny": 16, "medium": 4}


def step_seconds(overrides: list[str]) -> float:
    exp = experiment(overrides)
    return ours(replace(exp, train_batches=Fixed(exp.eval_batches[0])))


def main() -> None:
    args = bench_args(__doc__, SIZES)
    for size in args.sizes:
        b = PAIRS[size]
        sft_args = SIZES[size] + ["data=jsonl_sft", f"data.batch_size={2 * b}"]
        dpo_args = SIZES[size] + ["data=jsonl_prefs", "algorithm=dpo", f"data.batch_size={b}"]
        sft, dpo, pre = [], [], []
        for _ in range(args.trials):
            sft.append(step_seconds(sft_args))
            dpo.append(step_seconds(dpo_args))
            if not args.quick:  # printed, not a row
                pre.append(step_seconds(dpo_args + ["algorithm.precompute_reference=true"]))
        s, d = statistics.median(sft), statistics.median(dpo)
        print(f"{size:7s} SFT {2 * b} sequences {s * 1e3:8.2f} ms/step | DPO {b} pairs {d * 1e3:8.2f} ms/step "
              f"| ratio {d / s:.3f} (floor 1.33, goal <= 1.4)"
              + (f" | precomputed reference {statistics.median(pre) / s:.3f} (floor 1.0)" if pre else ""))
        emit(f"DPO step / SFT step ({size})", d / s, "<= 1.4")


if __name__ == "__main__":
    main()
