"""Parallel (joblib) and Bayesian (Optuna) sweeps through the CLI, and the report at their end."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import optuna
import pytest

from stack.launch.worker_cores import share
from tests.helpers import fake_devices, run_cli

SMALL = ["+recipe=llama_sft", "trainer.steps=12", "trainer.eval_every=6", "trainer.log_every=6",
         "trainer.eval_batches=1", "data.batch_size=8"]


def status(job_dir) -> dict:
    with open(os.path.join(job_dir, "status.json")) as f:
        return json.load(f)


def png_is_drawn(path, min_size=(300, 400)) -> None:
    import matplotlib.image

    image = matplotlib.image.imread(path)
    assert image.shape[0] >= min_size[0] and image.shape[1] >= min_size[1]
    assert float(np.std(image[..., :3])) > 0.02, f"{path} is blank"


def test_joblib_sweep_runs_jobs_in_workers_isolates_a_failure_and_reports(tmp_path):
    sweep = tmp_path / "sweep"
    res = run_cli(["-m", "optimizer.lr=1e-3,3e-3,1e6,2e-3", "optimizer.clip_norm=1e9", "mesh=fsdp",
                   "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}"] + SMALL,
                  cwd=str(tmp_path), env=fake_devices(4))
    assert res.returncode == 1, "the failed job must make the sweep's exit code non-zero"
    assert "1 job(s) failed" in res.stderr and f"{sweep}/2: RunFailed: train/loss is non-finite" in res.stderr
    assert "Traceback" not in res.stderr  # the failed job's one paragraph
    jobs = {d: status(sweep / d) for d in "0123"}
    assert [jobs[d]["status"] for d in "0123"] == ["completed", "completed", "failed", "completed"]
    assert all(jobs[d]["devices"] == 4 for d in "013"), "XLA_FLAGS did not reach the joblib workers"
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:  # each worker pinned to its own half of the cores (stack.launch.worker_cores)
        assert {tuple(jobs[d]["cores"]) for d in "013"} <= {tuple(share(cores, slot, 2)) for slot in (0, 1)}
    for d in "013":  # each job its own run dir and metrics
        rows = [json.loads(x) for x in open(sweep / d / "metrics.jsonl")]
        assert rows[-1]["eval/loss"] == jobs[d]["value"]
    with open(sweep / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["job"] for r in rows][-1] == "2" and rows[-1]["status"] == "failed"  # no value: last
    finals = [float(r["final"]) for r in rows[:3]]
    assert finals == sorted(finals) and {float(r["optimizer.lr"]) for r in rows} == {1e-3, 3e-3, 1e6, 2e-3}
    table = res.stdout[res.stdout.index(f"sweep {sweep}: 4 jobs"):]
    assert "eval/loss (final)" in table and "wrote summary.csv, curves.png" in table
    png_is_drawn(sweep / "curves.png")


def test_optuna_study_improves_on_its_first_trial_and_a_rerun_continues_it(tmp_path):
    sweep = tmp_path / "study"
    search = ["hydra/sweeper=optuna", "hydra.sweeper.n_jobs=2", "hydra/launcher=joblib",
              "optimizer.lr=tag(log,interval(1e-5,1e-2))", f"hydra.sweep.dir={sweep}"] + SMALL
    res = run_cli(["-m", "hydra.sweeper.n_trials=6"] + search, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    study = optuna.load_study(study_name="stack", storage=f"sqlite:///{sweep}/optuna.db")
    values = [t.value for t in study.trials]
    assert len(values) == 6 and all(v is not None for v in values)
    assert study.direction == optuna.study.StudyDirection.MINIMIZE  # auto: eval/loss is minimized
    assert min(values) < values[0], f"no trial improved on the first: {values}"
    for t in study.trials:  # each trial is the job in the dir of its number, with its sampled lr
        assert status(sweep / str(t.number))["value"] == t.value
    png_is_drawn(sweep / "optuna_history.png", (200, 300))
    png_is_drawn(sweep / "optuna_importances.png", (200, 300))

    res = run_cli(["-m", "hydra.sweeper.n_trials=2"] + search, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    study = optuna.load_study(study_name="stack", storage=f"sqlite:///{sweep}/optuna.db")
    assert [t.value for t in study.trials][:6] == values and len(study.trials) == 8
    assert os.path.isfile(sweep / "7" / "status.json") and "sweep " + str(sweep) + ": 8 jobs" in res.stdout


def test_wandb_runs_of_a_sweep_are_grouped_and_its_summary_is_a_table(tmp_path):
    from stack.launch.report import sweep_group
    from stack.logging.wandb_reader import read_offline_run

    sweep = tmp_path / "sweep"
    res = run_cli(["-m", "optimizer.lr=1e-3,3e-3", "+logger=wandb", f"hydra.sweep.dir={sweep}"] + SMALL,
                  cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    for job, lr in (("0", "0.001"), ("1", "0.003")):
        run = read_offline_run(sweep / job)
        assert (run["group"], run["job_type"], run["tags"]) == (sweep_group(str(sweep)), "sft", ["llama_sft", "cpu"])
        assert f"optimizer.lr={lr}" in run["name"] and run["summary"]["eval/loss"] == status(sweep / job)["value"]
    summary = read_offline_run(sweep / "wandb")
    assert (summary["name"], summary["job_type"], summary["group"]) == ("summary", "sweep", sweep_group(str(sweep)))
    (row,) = summary["history"]
    files = os.path.dirname(next((sweep / "wandb").glob("offline-run-*/run-*.wandb")))
    with open(os.path.join(files, "files", row["sweep/summary.path"])) as f:
        table = json.load(f)
    assert table["columns"][:2] == ["job", "optimizer.lr"] and [r[0] for r in table["data"]] == [
        j for j, _ in sorted(((j, status(sweep / j)["value"]) for j in "01"), key=lambda x: x[1])]


def session_processes(sid: int) -> list[int]:
    """The live processes of session `sid` (/proc/PID/stat: its 6th field; zombies have ended)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry))
    return found


@pytest.mark.slow  # ~40 s each: two sweeps of 4 jobs
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C", "SIGTERM"])
def test_a_signal_to_a_joblib_sweep_leaves_no_process_and_a_rerun_finishes_it(tmp_path, sig):
    """SIGINT (Ctrl-C) or SIGTERM to the sweep's main process: the running jobs save (SIGTERM), no
    later job starts, and within 10 s nothing of its session is left (loky workers and resource
    trackers went on as orphans, the workers training; SIGTERM killed the main process alone). Exit
    128 + the signal. The same command then resumes and completes every job."""
    sweep = tmp_path / "sweep"
    argv = ["-m", "seed=0,1,2,3", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}",
            "+recipe=llama_sft", "trainer.steps=300", "trainer.eval_every=0", "trainer.eval_batches=1",
            "data.batch_size=8"]
    proc = subprocess.Popen([sys.executable, "-m", "stack", *argv], cwd=str(tmp_path), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (sweep / "0" / "checkpoints").is_dir() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(session_processes(proc.pid)) >= 3, "the workers did not start"
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 128 + sig
    deadline = time.monotonic() + 10
    while session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = session_processes(proc.pid)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} processes of the sweep outlived it"
    assert not (sweep / "2" / "status.json").exists() and not (sweep / "3" / "status.json").exists()
    res = run_cli(argv, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    assert [status(sweep / str(i))["status"] for i in range(4)] == ["completed"] * 4


def test_a_damaged_study_db_is_one_paragraph_and_nothing_runs(tmp_path):
    """It was an 83-line SQLAlchemy traceback (issue 82)."""
    sweep = tmp_path / "study"
    sweep.mkdir()
    (sweep / "optuna.db").write_bytes(b"\x00not sqlite" * 100)
    res = run_cli(["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1", "optimizer.lr=interval(1e-4,1e-2)",
                   f"hydra.sweep.dir={sweep}"] + SMALL, cwd=str(tmp_path))
    assert res.returncode == 2 and res.stderr.startswith(f"error: The Optuna study 'stack' in '{sweep}/optuna.db' "
                                                         "cannot be opened ((sqlite3.DatabaseError) file is not a "
                                                         "database); it is not a study of this sweep"), res.stderr
    assert res.stderr.count("\n") == 1 and os.listdir(sweep) == ["optuna.db"]


@pytest.mark.slow  # ~30 s: a sweep of 2 jobs, stopped, then finished
def test_sigterm_to_a_sweep_of_hydras_basic_launcher_saves_the_job_and_starts_no_other(tmp_path):
    """The job runs in the sweep's own process: its loop saves (as on preemption), then the sweep ends
    with 143 instead of starting the next job (it did: a preempted job returned like a finished one)."""
    sweep = tmp_path / "sweep"
    argv = ["-m", "seed=0,1", f"hydra.sweep.dir={sweep}", "+recipe=llama_sft", "trainer.steps=300",
            "trainer.eval_every=0", "trainer.eval_batches=1", "data.batch_size=8"]
    proc = subprocess.Popen([sys.executable, "-m", "stack", *argv], cwd=str(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    metrics, deadline = sweep / "0" / "metrics.jsonl", time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2) and time.monotonic() < deadline:
        time.sleep(0.2)  # the loop is running (its handler saves on SIGTERM)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == "terminated (SIGTERM)", err[-2000:]
    assert "checkpoint saved; rerun the same command to resume" in out and not (sweep / "1").exists()
    res = run_cli(argv, cwd=str(tmp_path))
    assert res.returncode == 0 and "resumed from" in res.stdout, res.stderr[-3000:]
    assert [status(sweep / str(i))["status"] for i in range(2)] == ["completed"] * 2
