"""`launcher=local`: 2 JAX processes × 4 fake CPU devices over loopback (jax.distributed) train
like 1 process × 8 devices, step for step, for SFT and DPO; process 0 alone logs; a 2-process
run killed with -9 resumes to the uninterrupted losses."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import fake_devices, read_metrics, run_cli
from tests.helpers import train_losses as losses
from tests.integration.test_grpo_run import args as grpo_args

COMMON = ["mesh=dp", "trainer.log_every=1", "trainer.eval_every=0", "trainer.eval_batches=1", "logger=jsonl"]
RUNS = {"sft": ["+recipe=llama_sft", "checkpoint=none", "trainer.steps=6"],
        "dpo": ["+recipe=llama_dpo", "checkpoint=none", "trainer.steps=6", "data.batch_size=16"]}
LOCAL = ["launcher=local", "launcher.num_processes=2"]
ROOT = str(Path(__file__).parents[2])  # the ranks import tests.unit.reward_fns


def assert_same_losses(a, b) -> None:
    assert list(a) == list(b)
    assert list(a.values()) == pytest.approx(list(b.values()), rel=1e-5)  # summation order differs only


# sft: slow tier
@pytest.mark.parametrize("algorithm", [pytest.param(a, marks=pytest.mark.slow) if a == "sft" else a
                                       for a in sorted(RUNS)])
def test_two_processes_train_like_one(algorithm, tmp_path):
    args = RUNS[algorithm] + COMMON
    one = run_cli(args + [f"run_dir={tmp_path}/one"], str(tmp_path), env=fake_devices(8))
    assert one.returncode == 0, one.stderr[-3000:]
    two = run_cli(args + LOCAL + [f"run_dir={tmp_path}/two", f"hydra.run.dir={tmp_path}/elsewhere"], str(tmp_path),
                  env=fake_devices(4))  # the ranks' job dir is the run dir
    assert two.returncode == 0, two.stderr[-3000:]
    assert "2 processes exited with [0, 0]" in two.stderr
    both = two.stdout + two.stderr
    assert "[Gloo]" not in both, both[max(0, both.find("[Gloo]") - 300):][:600]  # relayed without it
    assert_same_losses(losses(tmp_path / "one"), losses(tmp_path / "two"))
    evals = [r["eval/loss"] for r in read_metrics(tmp_path / "two") if "eval/loss" in r]
    assert len(evals) == 2  # one writer: process 0 (rank 1's output is its log)
    assert "done: 6 steps" in (tmp_path / "two" / "rank1.log").read_text()
    assert not {"app.log", "__main__.log", ".hydra"} & set(os.listdir(tmp_path / "two"))  # Hydra's files: none
    assert sorted(os.listdir(tmp_path)) == ["one", "two"]  # nor under outputs/ or hydra.run.dir
    if algorithm == "sft":  # the path of a 2-task SLURM job (stack.launch.slurm), locally
        assert_submitit_two_tasks_train_like(tmp_path / "one", args, tmp_path)


@pytest.mark.slow  # ~27 s (three 2-process runs): CI's slow step runs it
def test_a_killed_two_process_run_resumes(tmp_path):
    args = RUNS["sft"][:1] + COMMON + ["trainer.steps=12", "checkpoint=local", "checkpoint.every=3"]
    ref = run_cli(args + [f"run_dir={tmp_path}/ref"], str(tmp_path), env=fake_devices(8))
    assert ref.returncode == 0, ref.stderr[-3000:]
    run_dir, env = tmp_path / "run", {**fake_devices(4), "WANDB_SILENT": "true"}
    proc = subprocess.Popen([sys.executable, "-m", "stack", *args, *LOCAL, f"run_dir={run_dir}"], cwd=tmp_path,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while not any(r.get("step", 0) >= 7 for r in (read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists()
                                                 else [])):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and both ranks: no handler runs
    proc.wait()
    assert len(losses(run_dir)) < 12
    res = run_cli(args + LOCAL + [f"run_dir={run_dir}"], str(tmp_path), env=fake_devices(4))
    assert res.returncode == 0 and "resumed from" in res.stdout, res.stderr[-3000:]
    assert_same_losses(losses(run_dir), losses(tmp_path / "ref"))


ENV = ["env.environment=tests.unit.env_fns.Chatter", "env.max_turns=3", "algorithm.max_new_tokens=12"]


@pytest.mark.parametrize("env", [[], pytest.param(ENV, marks=pytest.mark.slow)], ids=["single_turn", "env"])
def test_grpo_on_two_processes_samples_and_scores_like_one(tmp_path, env):
    """Each process decodes and scores the completions of its own prompts (host rewards over the
    process-local rows, stack.hardware.mesh.process_rows): the same per-step rewards and losses as
    1 process x 8 devices (before, scoring fetched the global completions and failed). With an
    environment (slow tier), each process also rolls out its own rows' turns."""
    def run(name: str, extra: list[str], devices: int) -> dict:
        cfg = grpo_args(tmp_path, tmp_path / name) + ["checkpoint=none", "trainer.steps=4", "mesh=dp", *extra,
                                                      "allow_targets=[tests.unit]", *env,
                                                      "reward.functions=[tests.unit.reward_fns.fingerprint]"]
        res = run_cli(cfg, str(tmp_path), env={**fake_devices(devices), "PYTHONPATH": ROOT})
        assert res.returncode == 0, res.stderr[-3000:]
        return {r["step"]: [r[f"train/{k}"] for k in ("reward", "reward_std", "loss")]
                for r in read_metrics(tmp_path / name) if "train/reward" in r}

    one, two = run("one", [], 8), run("two", LOCAL, 4)
    assert list(one) == list(two) == [1, 2, 3, 4]
    assert len({r for r, _, _ in one.values()}) > 1 and all(s > 0 for _, s, _ in one.values())
    for a, b in zip(one.values(), two.values(), strict=True):  # the same completions, scored and grouped alike
        assert a[:2] == pytest.approx(b[:2], rel=1e-6) and a[2] == pytest.approx(b[2], rel=1e-4, abs=1e-6)


def test_dpo_with_a_precomputed_reference_on_two_processes_trains_like_one(tmp_path):
    """The first pass over the records runs on both processes (each feeds every other batch) and
    gathers the reference log-probs of every record to both: 1 x 8's train and eval losses."""
    args = RUNS["dpo"] + COMMON + ["algorithm.precompute_reference=true", "trainer.eval_every=3"]
    one = run_cli(args + [f"run_dir={tmp_path}/one"], str(tmp_path), env=fake_devices(8))
    two = run_cli(args + LOCAL + [f"run_dir={tmp_path}/two"], str(tmp_path), env=fake_devices(4))
    assert one.returncode == 0 and two.returncode == 0, (one.stderr + two.stderr)[-3000:]
    assert "precomputed ref_logps for" in two.stdout
    assert_same_losses(losses(tmp_path / "one"), losses(tmp_path / "two"))
    evals = [[r["eval/loss"] for r in read_metrics(tmp_path / run) if "eval/loss" in r] for run in ("one", "two")]
    assert len(evals[0]) == 3 and evals[0] == pytest.approx(evals[1], rel=1e-5)


def test_one_device_per_process_with_the_default_mesh(tmp_path):
    """Plain CPU, one device a process, mesh=auto: its 1-device default (single) becomes data
    parallel over both processes' devices (before, rank 1 held no part of the mesh and failed)."""
    args = RUNS["sft"] + [a for a in COMMON if a != "mesh=dp"]
    one = run_cli(args + [f"run_dir={tmp_path}/one"], str(tmp_path), env=fake_devices(1))
    two = run_cli(args + LOCAL + [f"run_dir={tmp_path}/two"], str(tmp_path), env=fake_devices(1))
    assert one.returncode == 0 and two.returncode == 0, (one.stderr + two.stderr)[-3000:]
    assert json.loads((tmp_path / "two" / "status.json").read_text())["devices"] == 2
    assert_same_losses(losses(tmp_path / "one"), losses(tmp_path / "two"))


def test_mode_compile_on_two_processes_reports_from_both_and_leaves_no_hydra_files(tmp_path):
    """mode=compile through launcher=local: both ranks compile the step over the 2-process mesh and
    report; Hydra's job dir is the run dir, which gets no app.log (before: an empty one, appended to
    by every rank) and no `.hydra/`."""
    args = ["model=llama_tiny", "mode=compile", *LOCAL, f"run_dir={tmp_path}/run",
            f"hydra.run.dir={tmp_path}/elsewhere"]
    res = run_cli(args, str(tmp_path), env=fake_devices(1))
    assert res.returncode == 0 and "2 processes exited with [0, 0]" in res.stderr, res.stderr[-3000:]
    assert "per device (train step)" in res.stdout
    assert "per device (train step)" in (tmp_path / "run" / "rank1.log").read_text()
    assert os.listdir(tmp_path / "run") == ["rank1.log"] and os.listdir(tmp_path) == ["run"]


def test_a_failing_rank_stops_the_job(tmp_path):
    """Rank 1 raises at build while rank 0 waits for it in the first collective: rank 1 exits at
    once instead of at jax.distributed's shutdown barrier, so the launcher learns of it, stops
    rank 0 and exits non-zero (before, all three waited forever)."""
    args = [*RUNS["sft"], "trainer.eval_every=1", "allow_targets=[tests.unit.reward_fns]",
            "optimizer.schedule._target_=tests.unit.reward_fns.schedule_failing_on_process_1",
            *LOCAL, "launcher.grace_seconds=2", f"run_dir={tmp_path}/run"]
    res = run_cli(args, str(tmp_path), env={"PYTHONPATH": ROOT}, timeout=150)
    codes = re.search(r"2 processes exited with \[(-?\d+), (-?\d+)\]", res.stderr)
    assert res.returncode != 0 and codes, res.stderr[-3000:]
    assert "the schedule fails on process 1" in (tmp_path / "run" / "rank1.log").read_text()
    assert int(codes[2]) == 1 and int(codes[1]) != 1, codes[0]  # rank 0 stopped, not failed by gloo's 30 s timeout
    assert res.returncode == 1  # the failing rank's code, not that of the rank the launcher stopped


@pytest.mark.slow  # ~18 s: CI's slow step runs it
def test_a_killed_launcher_takes_its_ranks_down(tmp_path):
    """SIGKILL to the launcher alone: the kernel sends its ranks SIGTERM (PR_SET_PDEATHSIG), they
    save as on a preemption and exit; no rank is left behind."""
    run_dir = tmp_path / "run"
    args = [*RUNS["sft"][:1], *COMMON, "trainer.steps=100000", "checkpoint=local", *LOCAL, f"run_dir={run_dir}"]
    proc = subprocess.Popen([sys.executable, "-m", "stack", *args], cwd=tmp_path, env=fake_devices(1),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    wait_for(lambda: (run_dir / "metrics.jsonl").exists() and len(read_metrics(run_dir)) >= 3, proc)
    proc.kill()
    proc.wait()
    deadline = time.time() + 60
    while group_alive(proc.pid):
        assert time.time() < deadline, "a rank outlived its launcher"
        time.sleep(0.2)
    assert json.loads((run_dir / "status.json").read_text())["status"] == "preempted"


@pytest.mark.parametrize("sent", ["sigterm_to_rank_1", pytest.param("ctrl_c", marks=pytest.mark.slow)])
def test_a_signal_stops_every_rank_at_the_same_step(sent, tmp_path):
    """SIGTERM to rank 1 alone, or Ctrl-C (SIGINT to the launcher and both ranks): every rank stops
    after the same step and saves it; the launcher waits for them. Before, a rank stopped alone and
    waited in the save's barrier while the other waited for it in a step (or the launcher exited
    at once on Ctrl-C)."""
    run_dir = tmp_path / "run"
    args = [*RUNS["sft"][:1], *COMMON, "trainer.steps=100000", "checkpoint=local", *LOCAL, f"run_dir={run_dir}"]
    with open(tmp_path / "rank0.log", "w") as out:  # the launcher's console: rank 0's output
        proc = subprocess.Popen([sys.executable, "-m", "stack", *args], cwd=tmp_path, env=fake_devices(1),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for(lambda: (run_dir / "metrics.jsonl").exists() and len(read_metrics(run_dir)) >= 20, proc)
    if sent == "ctrl_c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(rank_pid(proc.pid, 1), signal.SIGTERM)
    try:
        assert proc.wait(timeout=90) == (130 if sent == "ctrl_c" else 0)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if group_alive(proc.pid) else None
    signum = 2 if sent == "ctrl_c" else 15
    said = [re.search(rf"preempted by signal {signum} after step (\d+)", log.read_text())
            for log in (tmp_path / "rank0.log", run_dir / "rank1.log")]
    assert all(said) and said[0][1] == said[1][1], said
    assert (run_dir / "checkpoints" / said[0][1]).is_dir()


@pytest.mark.slow  # ~15 s: CI's slow step runs it
def test_a_nonfinite_loss_stops_every_rank_after_the_same_step(tmp_path):
    """The lr turns NaN at update 30: both ranks see it at the same wait (with several processes
    the loop waits after each logging step, not on its own measured rhythm) and stop after the
    same step with the non-finite message; none waits for the other in a step's collective."""
    args = [*RUNS["sft"][:2], *COMMON, "trainer.steps=200", "allow_targets=[tests.unit.reward_fns]",
            "optimizer.schedule._target_=tests.unit.reward_fns.schedule_nan_from", *LOCAL,
            f"run_dir={tmp_path}/run"]
    res = run_cli(args, str(tmp_path), env={**fake_devices(1), "PYTHONPATH": ROOT}, timeout=150)
    logs = [res.stderr, (tmp_path / "run" / "rank1.log").read_text()]
    done = [re.search(r"train/loss is non-finite .* The run stopped after step (\d+)\.", log) for log in logs]
    assert res.returncode == 1 and all(done), (res.stdout + res.stderr)[-3000:]
    assert done[0][1] == done[1][1] and 30 < int(done[0][1]) < 200


def rank_pid(launcher_pid: int, rank: int) -> int:
    """The pid of a launcher=local rank (its child with STACK_PROCESS_ID=rank)."""
    for child in Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split():
        if f"STACK_PROCESS_ID={rank}".encode() in Path(f"/proc/{child}/environ").read_bytes().split(b"\0"):
            return int(child)
    raise AssertionError(f"no rank {rank} under {launcher_pid}")


def wait_for(condition, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while not condition():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.1)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_sweep_with_a_local_launcher_is_refused(tmp_path):
    res = run_cli(["-m", "seed=0,1", *LOCAL], str(tmp_path))
    assert res.returncode == 2 and "not a sweep (-m)" in res.stderr


@pytest.mark.parametrize("launcher", [LOCAL, ["launcher=tpu_pod", "launcher.tpu_name=my-tpu"]],
                         ids=["local", "tpu_pod"])
def test_cfg_job_with_a_launcher_prints_the_config_and_starts_nothing(launcher, tmp_path):
    """--cfg job shows the composed config whatever the launcher. It started the job: launcher=local
    two ranks (which failed on Hydra's flags), launcher=tpu_pod its gcloud ssh command."""
    res = run_cli(["+recipe=llama_sft", *launcher, "--cfg", "job"], str(tmp_path))
    assert res.returncode == 0, res.stderr[-2000:]
    shown = yaml.safe_load(res.stdout)
    assert shown["launcher"]["name"] == launcher[0].split("=")[1] and shown["algorithm"]["name"] == "sft"
    assert os.listdir(tmp_path) == []  # no run dir, no rank logs


def assert_submitit_two_tasks_train_like(reference, args: list[str], tmp_path) -> None:
    """hydra/launcher=submitit_local with 2 tasks x 4 devices: the tasks become one JAX program
    through the rank mapping of stack.launch.slurm and train step for step like `reference`."""
    sweep = tmp_path / "sweep"
    res = run_cli(["-m", *args, "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2",
                   f"hydra.sweep.dir={sweep}"], str(tmp_path), env=fake_devices(4))
    assert res.returncode == 0, res.stderr[-3000:]
    status = json.loads((sweep / "0" / "status.json").read_text())
    assert status["status"] == "completed" and status["devices"] == 8  # 2 tasks x 4 devices, one mesh
    assert_same_losses(losses(reference), losses(sweep / "0"))
