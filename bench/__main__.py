"""Every bench, one table: `python -m bench` (full sizes) or `python -m bench --quick` (the same rows
at smaller sizes and one trial, a few minutes on 2 cores), from the repository root.

Each bench runs in its own process (its XLA flags and threads are its own) and prints its usual
lines plus its rows (bench/rows.py); the table lists bench, ratio, goal and `ok` or `miss` last.
The processes share one persistent compilation cache (a program another bench, an earlier run in
the same bench or an earlier `python -m bench` compiled loads from it; every ratio leaves compilation
out): the one `python -m stack` uses (stack.hardware.compile_cache.compilation_cache_dir), or a fresh one with
`--cold` (as a new machine's first run). The benches that time compilation keep their own caches.
A bench that needs a package that is not installed (libtpu, Tunix) is named under the table.
`--logs DIR` keeps each bench's own output (its measurements behind the row) in DIR/<bench>.log.
`--markdown` prints the table as markdown (bench, measures, reading, goal, ok/miss) on stdout, the
progress on stderr: bench/README.md's table is that output, pasted between its markers.
"""

import argparse
import contextlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

from bench.rows import holds, parse
from stack.checkpoint.rundir import creatable
from stack.errors import ConfigError, exit_on
from stack.hardware.compile_cache import compilation_cache_dir
from stack.tools.outdir import check_out

HERE = os.path.dirname(os.path.abspath(__file__))
# script: (arguments at full size, arguments with --quick, the module it needs or None)
BENCHES = {
    "step_overhead": ([], ["--quick"], None),
    "dpo_step": ([], ["--quick"], None),
    "grpo_step": ([], ["--quick"], None),
    "rollout": ([], ["--quick"], None),
    "log_every": ([], ["--quick"], None),
    "data_pipeline": ([], ["--quick"], None),
    "checkpoint": ([], ["--quick"], None),
    "first_step": ([], ["--quick"], None),
    "sweep_parallel": ([], ["--quick"], None),
    "quant_step": ([], ["--quick"], None),
    "aot_compile": ([], ["model=llama_small"], "libtpu"),  # quick: the TPU compile path, in seconds
    "tunix_grpo": ([], ["--trials", "1", "--rounds", "4", "--warmup", "1"], "tunix"),
    "tunix_dpo": ([], ["--trials", "1", "--steps", "32", "--warmup", "2"], "tunix"),
    "tunix_first_step": ([], ["--quick"], "tunix"),
}
TIMES_COMPILE = {"aot_compile", "first_step", "tunix_first_step"}  # no shared compilation cache for these


def run(script: str, args: list[str], cache: str, logs: str | None = None) -> tuple[list[dict], str]:
    """(rows, '' or why the bench failed) of one bench process; `cache`: the shared compilation cache;
    `logs`: a folder for the process's own output, stdout then stderr, as `<script>.log`."""
    env = dict(os.environ)
    if BENCHES[script][2] != "libtpu":  # a CPU bench: no TPU plugin probe at each jax start where libtpu is installed
        env.setdefault("JAX_PLATFORMS", "cpu")
    if script not in TIMES_COMPILE:
        env.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    res = subprocess.run([sys.executable, os.path.join(HERE, f"{script}.py"), *args], capture_output=True, text=True,
                         env=env, check=False)
    rows = parse(res.stdout)
    if logs:
        with open(os.path.join(logs, f"{script}.log"), "w") as f:
            f.write(res.stdout + res.stderr)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return rows, f"exit {res.returncode}: {last[:120]}"
    return rows, "" if rows else "printed no row"


def entries(results: dict[str, tuple[list[dict], str]]) -> list[tuple[str, str, float | None, str, str]]:
    """(bench, row name or `failed (...)`, ratio or None, goal, ok or miss) of each row, in order."""
    out = []
    for script, (rows, failure) in results.items():
        out += [(script, r["name"], r["ratio"], r["goal"], "ok" if holds(r["ratio"], r["goal"]) else "miss")
                for r in rows]
        if failure:
            out.append((script, f"failed ({failure})", None, "", "miss"))
    return out


def table(results: dict[str, tuple[list[dict], str]]) -> list[str]:
    """The table lines: bench, ratio, goal, then ok or miss."""
    lines = [f"{'bench':64s} {'ratio':>8s}  {'goal':10s}"]
    for script, name, ratio, goal, verdict in entries(results):
        if ratio is None:
            lines.append(f"{script + ': ' + name:94s} {verdict}")
        else:
            lines.append(f"{script + ': ' + name:64s} {ratio:8.3f}  {goal:10s} {verdict}")
    return lines


def markdown(results: dict[str, tuple[list[dict], str]], missing: list[str] | None = None) -> list[str]:
    """The table as markdown lines: bench, measures (the row's name), reading (the ratio), goal, ok or miss;
    a failed bench is one `miss` row; `missing` (the benches not run) is named under the table."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| bench | measures | reading | goal | ok/miss |", "|---|---|---|---|---|"]
    for script, name, ratio, goal, verdict in entries(results):
        reading = "" if ratio is None else f"{ratio:.3f}"
        row = [f"`{script}`", cell(name), reading, cell(goal), verdict]
        lines.append("|" + "|".join(f" {c} " if c else " " for c in row) + "|")
    if missing:
        lines += ["", f"Not run: {', '.join(missing)}."]
    return lines


def shared_cache(cold: bool) -> contextlib.AbstractContextManager[str]:
    """The benches' compilation cache: `python -m stack`'s, or with `cold` a fresh temporary one."""
    if cold:
        return tempfile.TemporaryDirectory(prefix="bench-jax-cache-")
    return contextlib.nullcontext(compilation_cache_dir())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one trial")
    parser.add_argument("--cold", action="store_true", help="a fresh compilation cache, as on a new machine")
    parser.add_argument("--logs", metavar="DIR", help="write each bench's own output to DIR/<bench>.log")
    parser.add_argument("--markdown", action="store_true",
                        help="print the table as markdown (bench/README.md's table), the progress on stderr")
    parser.add_argument("--overwrite", action="store_true", help="write into a --logs DIR that is not empty")
    parser.add_argument("benches", nargs="*", help=f"a subset of {', '.join(BENCHES)} (default: all)")
    args = parser.parse_args(argv)
    with exit_on(ConfigError):
        if unknown := sorted(set(args.benches) - set(BENCHES)):
            raise ConfigError(f"unknown bench {', '.join(unknown)}; the benches: {', '.join(BENCHES)}.")
        if args.logs:
            check_out(args.logs, args.overwrite, "--logs")
            creatable(args.logs, "--logs")
    progress = sys.stderr if args.markdown else sys.stdout
    results, missing, start = {}, [], time.perf_counter()
    with shared_cache(args.cold) as cache:
        for script in args.benches or BENCHES:
            full, quick, needs = BENCHES[script]
            if needs and importlib.util.find_spec(needs) is None:
                missing.append(f"{script} (needs {needs})")
                continue
            began = time.perf_counter()
            results[script] = run(script, quick if args.quick else full, cache, args.logs)
            print(f"ran {script} in {time.perf_counter() - began:.0f} s", file=progress, flush=True)
    if args.markdown:
        print("\n".join(markdown(results, missing)))
        print(f"{time.perf_counter() - start:.0f} s", file=progress)
    else:
        print("\n".join(table(results)))
        print(f"{time.perf_counter() - start:.0f} s" + (f"; not run: {', '.join(missing)}" if missing else ""))
    sys.exit(1 if any(failure for _, failure in results.values()) else 0)


if __name__ == "__main__":
    main()
