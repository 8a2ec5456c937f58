"""Real `python -m stack` runs in subprocesses: run dir contents, learning, sweeps, wandb."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest
import yaml

from stack.logging.wandb_reader import read_offline_run
from tests.helpers import make_cfg, run_cli
from tests.helpers import read_metrics as metrics

SMALL = ["logger=jsonl", "trainer.log_every=5", "trainer.eval_every=10", "trainer.eval_batches=2"]


def test_20_step_run_writes_run_dir_and_learns(tmp_path):
    run_dir = tmp_path / "run"
    res = run_cli(SMALL + ["trainer.steps=20", f"run_dir={run_dir}"], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    rows = metrics(run_dir)
    train = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train] == [5, 10, 15, 20]
    assert train[-1]["train/loss"] < train[0]["train/loss"]
    evals = [r["eval/loss"] for r in rows if "eval/loss" in r]
    assert rows[0]["step"] == 0 and evals[-1] < evals[0]
    saved = yaml.safe_load(open(run_dir / "config.yaml"))
    assert saved["trainer"]["steps"] == 20 and saved["optimizer"]["schedule"]["total_steps"] == 20
    summary = [line for line in res.stdout.splitlines() if line.startswith("done:")]
    assert len(summary) == 1 and "20 steps" in summary[0] and str(run_dir) in summary[0]
    assert "\r" not in res.stdout, "progress bar drawn although stdout is not a TTY"
    assert sorted(os.listdir(tmp_path)) == ["run"], "run_dir=PATH: no outputs/ dir"
    assert not (run_dir / ".hydra").exists() and not (run_dir / "app.log").exists()


def test_default_run_halves_eval_loss(tmp_path):
    """`python -m stack` as a newcomer runs it (default recipe, Hydra's outputs/ run dir)."""
    res = run_cli([], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    (run_dir,) = [os.path.join(r, d) for r, ds, _ in os.walk(tmp_path / "outputs") for d in ds
                  if os.path.exists(os.path.join(r, d, "metrics.jsonl"))]
    evals = [r["eval/loss"] for r in metrics(run_dir) if "eval/loss" in r]
    assert evals[-1] <= 0.5 * evals[0], f"eval loss {evals[0]:.3f} -> {evals[-1]:.3f}"
    m = re.search(r"done: (\d+) steps in ([\d.]+)s", res.stdout)
    print(f"default run: {m.group(1)} steps in {m.group(2)} s, eval/loss {evals[0]:.3f} -> {evals[-1]:.3f}")


def test_named_recipe_with_overrides(tmp_path):
    run_dir = tmp_path / "run"
    res = run_cli(["+recipe=llama_sft", "model=llama_tiny", "trainer.steps=10", "optimizer.lr=3e-4",
                   f"run_dir={run_dir}"] + SMALL, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    saved = yaml.safe_load(open(run_dir / "config.yaml"))
    assert saved["data"]["name"] == "jsonl_sft" and saved["optimizer"]["lr"] == 3e-4


def test_multirun_grid_own_dirs_failures_do_not_stop_the_sweep_and_a_rerun_is_refused(tmp_path):
    """A 2 x 2 grid: each job its own dir and config; the two on a missing file fail, the sweep
    goes on and exits 1 naming them. The same sweep again refuses a completed job's dir."""
    good = make_cfg(["data=jsonl_sft"]).data.path
    grid = ["-m", "data=jsonl_sft", f"data.path={good},/nonexistent.jsonl", "optimizer.lr=1e-3,3e-4", "trainer.steps=2",
            f"hydra.sweep.dir={tmp_path}/sweep"] + SMALL
    res = run_cli(grid, cwd=str(tmp_path))
    assert res.returncode == 1, "a failed job must make the sweep's exit code non-zero"
    assert "2 job(s) failed" in res.stderr and "/nonexistent.jsonl" in res.stderr
    assert "Traceback" not in res.stderr and res.stderr.count("\nerror: ") + res.stderr.startswith("error: ") == 2
    jobs = [tmp_path / "sweep" / d for d in os.listdir(tmp_path / "sweep") if os.path.isdir(tmp_path / "sweep" / d)]
    assert len(jobs) == 4, jobs
    overrides = [yaml.safe_load((j / ".hydra" / "overrides.yaml").read_text()) for j in jobs]  # failed jobs' too
    lrs = sorted(float(o.split("=")[1]) for job in overrides for o in job if o.startswith("optimizer.lr="))
    assert lrs == [3e-4, 3e-4, 1e-3, 1e-3]  # each job its own values
    finished = [yaml.safe_load((j / "config.yaml").read_text()) for j in jobs if (j / "metrics.jsonl").exists()]
    assert sorted(c["optimizer"]["lr"] for c in finished) == [3e-4, 1e-3]
    assert {c["data"]["path"] for c in finished} == {good}
    assert res.stdout.count("done:") == 2
    job = tmp_path / "sweep" / "0"  # the same sweep again, its first job only: no checkpoint to resume it from
    written = {name: (job / name).read_text() for name in ("config.yaml", "metrics.jsonl", "status.json")}
    again = run_cli(["-m", "data=jsonl_sft", f"data.path={good}", "optimizer.lr=1e-3", "trainer.steps=2",
                     f"hydra.sweep.dir={tmp_path}/sweep"] + SMALL, cwd=str(tmp_path))
    assert again.returncode == 1 and "holds a completed run" in again.stderr, again.stderr[-3000:]
    assert {name: (job / name).read_text() for name in written} == written  # its status.json says completed still
    assert "holds a completed run" in again.stderr.split("job(s) failed")[1] and (job / "refused.json").is_file()
    assert "Traceback" not in again.stderr  # the refusal's paragraph, as a single run's (a 17-line traceback)


def test_task_returns_the_objective(tmp_path):
    from stack.run.modes import run

    cfg = make_cfg(SMALL + ["trainer.steps=5", f"run_dir={tmp_path}"])
    objective = run(cfg)
    last_eval = [r["eval/loss"] for r in metrics(tmp_path) if "eval/loss" in r][-1]
    assert objective == pytest.approx(last_eval, rel=1e-6)
    cfg = make_cfg(SMALL + ["trainer.steps=5", f"run_dir={tmp_path}/b", "trainer.objective=train/loss"])
    assert run(cfg) == pytest.approx([r["train/loss"] for r in metrics(tmp_path / "b") if "train/loss" in r][-1])


def test_wandb_offline_run_has_config_and_history(tmp_path):
    run_dir = tmp_path / "run"
    res = run_cli(["+logger=wandb", "trainer.steps=10", "trainer.log_every=5", f"run_dir={run_dir}"],
                  cwd=str(tmp_path), env={"WANDB_DIR": str(tmp_path), "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    run = read_offline_run(run_dir / "wandb")
    assert run["config"]["model"]["d_model"] == 64 and run["config"]["trainer"]["steps"] == 10
    ours = {r["step"]: r for r in metrics(run_dir)}
    logged = {h["_step"]: h for h in run["history"]}
    assert sorted(logged) == sorted(ours) == [0, 5, 10]
    assert logged[10]["train/loss"] == pytest.approx(ours[10]["train/loss"])
    assert run["summary"]["eval/loss"] == pytest.approx(ours[10]["eval/loss"])
    assert run["group"] is None


def test_wandb_group_is_the_sweep_name(tmp_path):
    res = run_cli(["-m", "+logger=wandb", "seed=0,1", "trainer.steps=2", "trainer.log_every=1",
                   f"hydra.sweep.dir={tmp_path}/sweep"], cwd=str(tmp_path),
                  env={"WANDB_DIR": str(tmp_path), "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    jobs = [tmp_path / "sweep" / d for d in os.listdir(tmp_path / "sweep")
            if (tmp_path / "sweep" / d / ".hydra").is_dir()]
    runs = [read_offline_run(j / "wandb") for j in jobs]  # (the sweep's summary run is sweep/wandb)
    assert len({r["id"] for r in runs}) == 2
    assert {r["group"] for r in runs} == {str(tmp_path / "sweep").replace("/", "_").strip("_")}


def test_help_says_what_stack_is_and_lists_the_recipes(tmp_path):
    """--help was Hydra's 'app is powered by Hydra.' header; now ours, over Hydra's lists."""
    res = run_cli(["--help"], str(tmp_path))
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("stack: compose an experiment from config groups")
    assert "powered by Hydra." not in res.stdout
    assert re.search(r"^recipe \(\+recipe=NAME\): .*llama_dpo.*llama_sft", res.stdout, re.M)
    groups = res.stdout.split("== The composed config")[0]
    assert re.search(r"^model: gemma3, gemma3_12b, .*hf, llama3_1b", groups, re.M) and "schema" not in groups
    assert os.listdir(tmp_path) == []


def test_mode_validate_builds_shape_only(capsys):
    from stack.run.modes import run

    run(make_cfg(["mode=validate", "model=llama3_70b"]))
    assert "70,553,706,496 params" in capsys.readouterr().out


def test_absent_platform_stops_before_compute(tmp_path):
    res = run_cli(["hardware=tpu_v5e", f"run_dir={tmp_path}/run"], cwd=str(tmp_path))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    for words in ("tpu", "v5e:2x2", "cpu", "hardware=cpu", "mode=compile"):
        assert words in res.stderr, words
    assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")


def test_perf_metrics_are_logged(tmp_path):
    cache = tmp_path / "cache"  # the CPU peak is measured once per machine, into the user cache
    res = run_cli(SMALL + ["trainer.steps=10", f"run_dir={tmp_path}"], cwd=str(tmp_path),
                  env={"STACK_CACHE_DIR": str(cache)})
    assert res.returncode == 0, res.stderr
    last = metrics(tmp_path)[-1]
    assert last["perf/tokens_per_sec"] > 0 and 0 < last["perf/mfu"] < 1
    (peak,) = cache.glob("cpu_peak-*.json")
    assert last["perf/tflops_per_device"] == pytest.approx(
        last["perf/mfu"] * json.load(open(peak))["flops_per_sec"] / 1e12, rel=1e-6)


def test_packed_run_logs_data_metrics(tmp_path):
    run_dir = tmp_path / "run"
    res = run_cli(SMALL + ["+recipe=llama_sft", "data.packing=true", "trainer.steps=10", f"run_dir={run_dir}"],
                  cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    last = [r for r in metrics(run_dir) if "train/loss" in r][-1]
    assert last["train/packing_efficiency"] > 0.8  # unpacked rows of this data are ~0.4 full
    assert 0 < last["data/epoch"] < 1 and 0 <= last["perf/data_wait_fraction"] <= last["perf/data_read_fraction"] < 1


def test_bad_record_mid_run_stops_with_file_and_line(tmp_path):
    good = [json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) for i in range(40)]
    (tmp_path / "train.jsonl").write_text("\n".join(good[:30] + ['{"prompt": "x"}'] + good[30:]) + "\n")
    (tmp_path / "eval.jsonl").write_text("\n".join(good[:8]) + "\n")
    res = run_cli(SMALL + ["data=jsonl_sft", f"data.path={tmp_path}/train.jsonl",
                           f"data.eval_path={tmp_path}/eval.jsonl",
                           "data.shuffle=false", "data.batch_size=4", "trainer.steps=20", f"run_dir={tmp_path}/r"],
                  cwd=str(tmp_path))
    assert res.returncode == 2, res.stderr
    assert "train.jsonl:31: a sft record needs a string field 'completion' (missing)" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_dpo_recipe_learns_the_held_out_preferences(tmp_path):
    """+recipe=llama_dpo (shortened to 400 of its 600 steps): held-out accuracy from 0 to > 0.9."""
    run_dir = tmp_path / "run"
    res = run_cli(["+recipe=llama_dpo", "trainer.steps=400", "trainer.eval_every=400", "trainer.log_every=100",
                   "logger=jsonl", f"run_dir={run_dir}"], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    evals = [r for r in metrics(run_dir) if "eval/rewards/accuracies" in r]
    assert evals[0]["step"] == 0 and evals[0]["eval/rewards/accuracies"] == 0.0
    assert evals[0]["eval/rewards/margins"] == 0.0  # the reference is the initial policy
    assert evals[-1]["step"] == 400 and evals[-1]["eval/rewards/accuracies"] > 0.9
    assert evals[-1]["eval/rewards/margins"] > 0.3


def test_ctrl_c_stops_the_sweep_and_no_later_job_starts(tmp_path):
    """SIGINT during job 0 of a 3-job sweep: it saves, the process exits 130 with one line, and
    jobs 1 and 2 never start (issue 15, item 5)."""
    from tests.integration.test_resume import start, wait_for_step

    sweep = tmp_path / "sweep"
    proc = start(["-m", "seed=0,1,2", "trainer.steps=200", "checkpoint=local", f"hydra.sweep.dir={sweep}"] + SMALL
                 + ["trainer.log_every=1", "trainer.eval_every=0"], str(tmp_path))
    wait_for_step(sweep / "0", 2, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "interrupted (Ctrl-C)", err[-2000:]
    assert not (sweep / "1").exists() and not (sweep / "2").exists()
    assert any(s.isdigit() for s in os.listdir(sweep / "0" / "checkpoints"))  # job 0 saved before stopping


def console_script(args: list[str], cwd, env: dict | None = None):
    """The installed `stack` console script (pyproject's [project.scripts]) beside this Python."""
    script = os.path.join(os.path.dirname(sys.executable), "stack")
    full_env = {**os.environ, "WANDB_SILENT": "true", **(env or {})}
    return subprocess.run([script, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300)


def test_the_stack_command_runs_composes_and_completes(tmp_path):
    res = console_script(["+recipe=llama_sft", "trainer.steps=2", "trainer.eval_batches=1", "logger=jsonl",
                          f"run_dir={tmp_path / 'run'}"], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert [r["step"] for r in metrics(tmp_path / "run") if "train/loss" in r][-1] == 2
    res = console_script(["+recipe=llama_dpo", "--cfg", "job"], tmp_path)
    assert res.returncode == 0 and yaml.safe_load(res.stdout)["algorithm"]["name"] == "dpo", res.stderr[-2000:]
    res = console_script(["--shell-completion", "install=bash"], tmp_path)
    assert "complete -o nospace -o default -F hydra_bash_completion stack" in res.stdout, res.stderr[-2000:]
    res = console_script(["--shell-completion", "query=bash"], tmp_path,
                         env={"COMP_LINE": "stack algorithm=", "COMP_POINT": "16"})
    assert set(res.stdout.split()) == {f"algorithm={a}" for a in ("dpo", "grpo", "ppo", "rm", "sft")}, res.stderr


def test_an_old_tool_path_names_the_new_one(tmp_path):
    """`python -m stack.hf export ...` (stack 0.1) says where the tool lives now."""
    res = subprocess.run([sys.executable, "-m", "stack.hf", "export", "x"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode != 0 and "it moved to 'stack.tools.hf'" in res.stderr, res.stderr
