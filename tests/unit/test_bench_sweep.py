"""bench/sweep_parallel.py's bound on its ratio: a job's steady tokens/s read back from the
jobs' metrics.jsonl files as a sweep writes them (<sweep dir>/<job>/metrics.jsonl)."""

import json
import os

from sweep_parallel import job_tokens_per_sec  # bench/, on the path by conftest.py


def write_job(sweep_dir: str, job: str, windows: list[float]) -> None:
    os.makedirs(os.path.join(sweep_dir, job))
    with open(os.path.join(sweep_dir, job, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 0, "eval/loss": 6.0}) + "\n")  # the step-0 eval: no perf
        for i, tok in enumerate(windows):
            f.write(json.dumps({"step": 20 * (i + 1), "train/loss": 3.0, "perf/tokens_per_sec": tok}) + "\n")


def test_a_job_counts_its_windows_after_the_first_and_the_sweep_its_median_job(tmp_path):
    write_job(str(tmp_path), "0", [10.0, 100.0, 200.0])  # the compiling first window left out: 150
    write_job(str(tmp_path), "1", [5.0, 20.0, 40.0, 60.0])  # median of 20, 40, 60: 40
    write_job(str(tmp_path), "2", [1000.0])  # one window: itself
    assert job_tokens_per_sec(str(tmp_path)) == 150.0
