"""QAT and QLoRA vs full fine-tuning on the medium model: step time (same process, alternating
trials, the trainer fed one fixed batch) and host memory (one child process per variant, 10
steps, no CPU peak probe: the bytes of the live jax arrays at the end, i.e. the train state and
batches, and the process's peak `ru_maxrss`), as ratios to full fine-tuning.

    python bench/quant_step.py
    python bench/quant_step.py --trials 5
    python bench/quant_step.py --quick       # full, int8_qat, qlora_nf4 at d_model 256, one trial

Rows (our budgets; the issue sets none): a QAT or QLoRA step within 1.25 x full fine-tuning's,
QLoRA's live arrays (weights + optimizer state) under half of full fine-tuning's.
"""

import argparse
import resource
import statistics
import subprocess
import sys
from dataclasses import replace

from rows import emit  # bench/ is on sys.path when run as a script
from step_overhead import SIZES, Fixed, experiment, ours

VARIANTS = {
    "full": [],
    "int8_qat": ["quantization=int8_qat"],
    "int4_qat": ["quantization=int4_qat"],
    "lora": ["quantization=lora"],
    "qlora_nf4": ["quantization=qlora_nf4"],
}
QUICK = ["model.d_model=256", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2", "model.d_ff=704",
         "data.seq_len=128", "data.batch_size=8", "trainer.steps=10"]


def step_seconds(name: str, size: list[str]) -> float:
    exp = experiment(size + VARIANTS[name])
    return ours(replace(exp, train_batches=Fixed(exp.eval_batches[0])))


def memory_mib(names: list[str], quick: bool) -> dict[str, tuple[float, float]]:
    """Per variant, (live jax array MiB, peak resident MiB) of a child process that trains it; the
    children run at once (memory, not time, is measured)."""
    children = {name: subprocess.Popen([sys.executable, __file__, "--child", name, *(["--quick"] if quick else [])],
                                       stdout=subprocess.PIPE, text=True) for name in names}
    memory = {}
    for name, child in children.items():
        out, _ = child.communicate()
        if child.returncode:
            raise RuntimeError(f"the {name} child exited {child.returncode}")
        live, peak = out.strip().splitlines()[-1].split()
        memory[name] = float(live), float(peak)
    return memory


def child(name: str, size: list[str]) -> None:
    """Train the variant for 10 steps and print its live array and peak resident MiB."""
    import jax

    from stack.engine.trainer import Trainer

    exp = experiment(size + VARIANTS[name] + ["hardware.peak_flops_per_chip=1e12"])  # no CPU probe
    trainer = Trainer(replace(exp, train_batches=Fixed(exp.eval_batches[0])))
    trainer.run()
    live = sum(a.nbytes for a in jax.live_arrays()) / 2**20
    print(live, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="3 variants at d_model 256, one trial")
    parser.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    size = QUICK if args.quick else SIZES["medium"]
    if args.child:
        return child(args.child, size)
    names = ["full", "int8_qat", "qlora_nf4"] if args.quick else list(VARIANTS)
    times = {name: [] for name in names}
    for _ in range(1 if args.quick else args.trials):
        for name in names:
            times[name].append(step_seconds(name, size))
    memory = memory_mib(["full", "qlora_nf4"] if args.quick else names, args.quick)
    (full_live, full_peak), full_t = memory["full"], min(times["full"])
    for name in names:
        t, (live, peak) = times[name], memory.get(name, (float("nan"), float("nan")))
        print(f"{name:10s} step min {min(t) * 1e3:7.1f} ms (median {statistics.median(t) * 1e3:7.1f}) ratio "
              f"{min(t) / full_t:.3f} | live arrays {live:6.0f} MiB ratio {live / full_live:.3f} | "
              f"peak resident {peak:6.0f} MiB ratio {peak / full_peak:.3f}")
        if name != "full":
            emit(f"{name} step / full fine-tuning step", min(t) / full_t, "<= 1.25")
    emit("qlora_nf4 live arrays / full fine-tuning's", memory["qlora_nf4"][0] / full_live, "<= 0.5")


if __name__ == "__main__":
    main()
