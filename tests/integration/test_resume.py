"""Checkpoints and resume with real Orbax checkpoints and real processes: SIGKILL at an
arbitrary step, SIGTERM preemption, a corrupt newest step, a config that changed."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

from stack.logging.wandb_reader import read_offline_run
from tests.helpers import fake_devices, read_metrics, run_cli, tensorboard_scalars
from tests.helpers import train_losses as losses

ARGS = ["+recipe=llama_sft", "checkpoint=local", "checkpoint.every=7", "checkpoint.keep=3", "trainer.steps=30",
        "trainer.log_every=1", "trainer.eval_every=0", "trainer.eval_batches=1", "data.batch_size=8"]


def start(args, cwd) -> subprocess.Popen:
    env = {**os.environ, "WANDB_SILENT": "true"}
    return subprocess.Popen([sys.executable, "-m", "stack", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_step(run_dir, step: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    path = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        if os.path.exists(path) and any(json.loads(line)["step"] >= step for line in open(path) if line.strip()):
            return
        time.sleep(0.05)
    raise TimeoutError(f"step {step} not reached")


def wait_for_checkpoint(run_dir, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until a step directory is committed: saves commit in the background (checkpoint.overlap),
    some steps after the one they hold."""
    path = os.path.join(run_dir, "checkpoints")
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        if os.path.isdir(path) and any(s.isdigit() for s in os.listdir(path)):
            return
        time.sleep(0.05)
    raise TimeoutError("no checkpoint committed")


def kill_at_step_and_rerun(args, run_dir, step: int, cwd, last: int) -> None:
    """Start `python -m stack ARGS`, kill -9 it once `step` is logged and a checkpoint is
    committed, check that checkpoint is before `last`, and rerun the same command to the end:
    it must resume."""
    proc = start(args, cwd)
    wait_for_step(run_dir, step, proc)
    wait_for_checkpoint(run_dir, proc)
    proc.kill()
    proc.wait()
    saved = sorted(int(s) for s in os.listdir(os.path.join(run_dir, "checkpoints")) if s.isdigit())
    assert saved and saved[-1] < last
    res = run_cli(args, cwd=cwd)
    assert res.returncode == 0 and "resumed from" in res.stdout, res.stderr[-3000:]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run's per-step losses."""
    run_dir = tmp_path_factory.mktemp("reference")
    res = run_cli(ARGS + ["logger=jsonl", f"run_dir={run_dir}"], cwd=str(run_dir))
    assert res.returncode == 0, res.stderr
    return losses(run_dir)


def test_sigkill_then_rerun_gives_the_uninterrupted_losses(tmp_path, reference):
    run_dir = tmp_path / "run"
    sinks = "logger=[jsonl,tensorboard,wandb]"
    proc = start(ARGS + [sinks, f"run_dir={run_dir}"], str(tmp_path))
    wait_for_step(run_dir, 17, proc)
    wait_for_checkpoint(run_dir, proc)  # step 7's save commits in the background, steps later
    proc.kill()  # SIGKILL: no handler runs, an async save may be cut short
    proc.wait()
    assert len(losses(run_dir)) < 30
    res = run_cli(ARGS + [sinks, f"run_dir={run_dir}"], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "resumed from" in res.stdout and "(resumed after step" in res.stdout
    assert losses(run_dir) == reference  # exactly, step by step
    steps = [r["step"] for r in read_metrics(run_dir) if "train/loss" in r]
    assert steps == sorted(set(steps))  # the rows the killed run logged after its checkpoint are gone
    runs = sorted(os.listdir(run_dir / "wandb"))
    ids = {d.rsplit("-", 1)[-1] for d in runs if d.startswith("offline-run-")}
    assert len(ids) == 1, runs  # the wandb run continues under the same id
    assert read_offline_run(str(run_dir / "wandb" / runs[-1]))["summary"]
    assert tensorboard_scalars(run_dir / "tensorboard", "train/loss") == pytest.approx(reference)  # purged, resumed


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_preemption_signal_saves_and_resumes(tmp_path, reference, sig):
    """SIGTERM exits 0; SIGINT (Ctrl-C) saves the same way, then exits 130 with one line."""
    run_dir = tmp_path / "run"
    proc = start(ARGS + ["logger=jsonl", f"run_dir={run_dir}"], str(tmp_path))
    wait_for_step(run_dir, 10, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == (130 if sig == signal.SIGINT else 0), err
    assert sig != signal.SIGINT or err.strip().splitlines()[-1] == "interrupted (Ctrl-C)", err
    stopped = max(losses(run_dir))
    assert f"preempted by signal {int(sig)} after step {stopped}" in out
    assert stopped < 30 and str(stopped) in os.listdir(run_dir / "checkpoints")
    res = run_cli(ARGS + ["logger=jsonl", f"run_dir={run_dir}"], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert f"resumed after step {stopped}" in res.stdout
    assert losses(run_dir) == reference


def test_corrupt_newest_step_is_skipped_and_config_changes_are_refused(tmp_path, reference):
    run_dir = tmp_path / "run"
    assert run_cli(ARGS + ["logger=jsonl", f"run_dir={run_dir}"], cwd=str(tmp_path)).returncode == 0
    assert sorted(os.listdir(run_dir / "checkpoints"), key=int) == ["21", "28", "30"]  # keep=3, final save
    saved = ocp.CheckpointManager(str(run_dir / "checkpoints")).restore(
        30, args=ocp.args.Composite(meta=ocp.args.JsonRestore(), state=ocp.args.StandardRestore()))
    meta, state = saved.meta, saved.state
    assert meta["step"] == 30 and meta["resolved_config"]["trainer"]["steps"] == 30 and meta["format"] == 2
    assert int(state["step"]) == 30 and np.asarray(state["key"]).shape == (2,)  # the TrainState's step and key
    written = {name: (run_dir / name).read_text() for name in ("config.yaml", "metrics.jsonl", "status.json")}
    changed = run_cli(ARGS + ["logger=jsonl", f"run_dir={run_dir}", "model.d_ff=96", "optimizer.lr=0.01"],
                      cwd=str(tmp_path))
    assert changed.returncode == 2
    assert "model.d_ff: 176 -> 96" in changed.stderr and "optimizer.lr: 0.003 -> 0.01" in changed.stderr
    # refused before it wrote: config.yaml still describes the checkpoints (reward=model and exports read it)
    assert {name: (run_dir / name).read_text() for name in written} == written
    for root, _, files in os.walk(run_dir / "checkpoints" / "30" / "state"):
        for name in files:
            if "ocdbt.process_0" in root and name != "manifest.ocdbt":
                open(os.path.join(root, name), "r+b").truncate(10)  # the newest step's arrays
    res = run_cli(ARGS + ["logger=jsonl", f"run_dir={run_dir}"], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "checkpoint step 30 in" in res.stderr and "cannot be restored" in res.stderr
    assert "resumed after step 28" in res.stdout
    assert losses(run_dir) == reference
    for step in os.listdir(run_dir / "checkpoints"):  # now break every step: no silent restart
        for root, _, files in os.walk(run_dir / "checkpoints" / step / "state"):
            for name in files:
                if "ocdbt.process_0" in root and name != "manifest.ocdbt":
                    os.remove(os.path.join(root, name))
    res = run_cli(ARGS + ["logger=jsonl", f"run_dir={run_dir}", "trainer.steps=40"], cwd=str(tmp_path))
    assert res.returncode == 2 and "none can be restored" in res.stderr and "Not restarting from scratch" in res.stderr
    lines = res.stderr.strip().splitlines()  # a one-line warning per step tried, then the paragraph
    assert len(lines) <= 5 and all(x.startswith(("warning: checkpoint step", "error: ")) for x in lines), res.stderr
    assert "[absl]" not in res.stdout and len(res.stdout.strip().splitlines()) <= 2, res.stdout[-3000:]


def test_nonfinite_loss_stops_without_saving_it(tmp_path):
    run_dir = tmp_path / "run"
    res = run_cli(["+recipe=llama_sft", "checkpoint=local", "checkpoint.every=2", "trainer.steps=40",
                   "trainer.log_every=40", "optimizer.lr=1e6", "optimizer.clip_norm=1e9", "data.batch_size=8",
                   "logger=jsonl", f"run_dir={run_dir}"], cwd=str(tmp_path))
    assert res.returncode == 1 and "non-finite" in res.stderr
    assert "done:" not in res.stdout  # the paragraph alone says how it ended (a done: line named another step)
    assert re.search(r"at step \d+; stopped without saving .* The run stopped after step \d+\.$", res.stderr.strip())
    manager = ocp.CheckpointManager(str(run_dir / "checkpoints"))
    for step in manager.all_steps():
        state = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore())).state
        assert all(np.isfinite(np.asarray(x)).all() for x in _leaves(state)), step


def _leaves(tree):
    import jax

    return jax.tree.leaves(tree)


@pytest.mark.slow  # main tier: a faster sibling covers it; CI runs the slow tier
def test_multi_tier_resumes_from_the_newest_step_across_tiers(tmp_path, reference):
    run_dir, durable = tmp_path / "run", tmp_path / "durable"
    args = ARGS + ["logger=jsonl", f"run_dir={run_dir}", "checkpoint=multi_tier", "checkpoint.every=4",
                   "checkpoint.keep=2", f"checkpoint.persistent.path={durable}", "checkpoint.persistent.every=10"]
    assert run_cli(args, cwd=str(tmp_path)).returncode == 0
    local = run_dir / "checkpoints"
    assert sorted(os.listdir(local), key=int) == ["28", "30"]
    assert sorted(os.listdir(durable), key=int) == ["10", "20", "30"]
    for tier in (local, durable):  # as if killed between steps 28 and 30
        shutil.rmtree(tier / "30")
    res = run_cli(args, cwd=str(tmp_path))
    assert res.returncode == 0 and "resumed after step 28" in res.stdout, res.stderr
    assert losses(run_dir) == reference
    shutil.rmtree(local)  # the fast local disk is gone (e.g. a new machine): the durable tier remains
    shutil.rmtree(durable / "30")
    res = run_cli(args, cwd=str(tmp_path))
    assert res.returncode == 0 and "resumed after step 20" in res.stdout, res.stderr
    assert losses(run_dir) == reference


@pytest.mark.slow  # main tier: a faster sibling covers it; CI runs the slow tier
def test_restore_onto_another_mesh_from_another_run(tmp_path, reference):
    """8 devices with fsdp write the checkpoint; 8 devices with dp resume it (resume=PATH)."""
    env = fake_devices(8)
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_cli(ARGS + ["logger=jsonl", "mesh=fsdp", f"run_dir={a}"], cwd=str(tmp_path), env=env).returncode == 0
    for step in ("28", "30"):
        shutil.rmtree(a / "checkpoints" / step)
    res = run_cli(ARGS + ["logger=jsonl", "mesh=dp", f"checkpoint.resume={a}/checkpoints", f"run_dir={b}"],
                  cwd=str(tmp_path), env=env)
    assert res.returncode == 0 and "resumed after step 21" in res.stdout, res.stderr
    got = losses(b)
    assert sorted(got) == list(range(22, 31))
    assert [got[s] for s in sorted(got)] == pytest.approx([reference[s] for s in sorted(got)], abs=1e-5)


def test_init_from_a_run_and_a_dpo_reference_from_a_checkpoint(tmp_path):
    from flax import nnx

    from stack.algorithms.base import Context
    from stack.algorithms.dpo import DPO
    from stack.checkpoint.saved_params import load_params
    from stack.errors import ConfigError
    from stack.models.init import init_model
    from stack.quant.providers import NoQuantization
    from tests.helpers import make_cfg

    a, b = tmp_path / "a", tmp_path / "b"
    small = ["+recipe=llama_sft", "trainer.log_every=5", "trainer.eval_every=0", "trainer.eval_batches=2",
             "logger=jsonl", "data.batch_size=8"]
    assert run_cli(small + ["trainer.steps=10", "checkpoint=local", f"run_dir={a}"], cwd=str(tmp_path)).returncode == 0
    res = run_cli(small + ["trainer.steps=1", f"model.init_from={a}/checkpoints", f"run_dir={b}"], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    final_a = [json.loads(x) for x in open(a / "metrics.jsonl")][-1]["eval/loss"]
    assert json.loads(open(b / "metrics.jsonl").readline())["eval/loss"] == pytest.approx(final_a, rel=1e-6)

    model = init_model(make_cfg(["algorithm=dpo", "data=jsonl_prefs"]).model, 0)
    own = np.asarray(model.embed.embedding[...])
    # the run dir stands for its checkpoints dir (stack.checkpoint.saved_params.checkpoints_of)
    reference = DPO(reference={"init_from": str(a)}).setup(model, Context(NoQuantization())).frozen["reference"]
    saved = ocp.CheckpointManager(str(a / "checkpoints")).restore(
        10, args=ocp.args.Composite(state=ocp.args.StandardRestore())).state["params"]["policy"]
    frozen = nnx.state(reference, nnx.Param)
    np.testing.assert_array_equal(np.asarray(frozen["embed"]["embedding"][...]), saved["embed"]["embedding"])
    assert not np.array_equal(own, saved["embed"]["embedding"])
    np.testing.assert_array_equal(np.asarray(model.embed.embedding[...]), own)  # the policy is untouched

    other = init_model(make_cfg(["+recipe=llama_sft", "model.d_model=32"]).model, 0)
    with pytest.raises(ConfigError) as info:  # another model: the error says which one the checkpoint fits
        load_params(other, str(a / "checkpoints"))
    written = make_cfg(["+recipe=llama_sft"]).model
    assert f"written for model={written.name}: vocab_size={written.vocab_size}, d_model={written.d_model}," in str(
        info.value) and "the model expects" in str(info.value)


@pytest.mark.slow  # main tier: a faster sibling covers it; CI runs the slow tier
def test_lora_dpo_with_precomputed_reference_resumes_from_the_saved_columns(tmp_path):
    """The reference log-probs are stored in every step and read back on resume (the policy has
    moved, so recomputing them would be wrong); the checkpoint holds the adapters only."""
    args = ["+recipe=llama_dpo", "quantization=lora", "optimizer.lr=1e-2", "algorithm.precompute_reference=true",
            "checkpoint.every=4", "trainer.log_every=1", "trainer.eval_every=0", "trainer.eval_batches=1",
            "logger=jsonl", "data.batch_size=8"]
    a, b = tmp_path / "a", tmp_path / "b"
    res = run_cli(args + ["trainer.steps=40", f"run_dir={a}"], cwd=str(tmp_path))
    assert res.returncode == 0 and "precomputed ref_logps for" in res.stdout, res.stderr
    proc = start(args + ["trainer.steps=40", f"run_dir={b}"], str(tmp_path))
    deadline = time.time() + 120
    while not os.path.isdir(b / "checkpoints" / "8") and time.time() < deadline:  # a finalised step
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.kill()
    proc.communicate()
    res = run_cli(args + ["trainer.steps=40", f"run_dir={b}"], cwd=str(tmp_path))
    assert res.returncode == 0 and "resumed after step" in res.stdout, res.stderr
    assert "precomputed ref_logps" not in res.stdout  # read from the checkpoint, not recomputed
    assert losses(b) == losses(a)

    manager = ocp.CheckpointManager(str(b / "checkpoints"))
    saved = manager.restore(40, args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                        columns=ocp.args.StandardRestore()))
    n_train = sum(1 for _ in open(os.path.join(os.path.dirname(__file__), "../../recipes/data/prefs_train.jsonl")))
    table = np.asarray(saved.columns["train"]["ref_logps"])
    assert table.shape == (n_train, 2) and np.isfinite(table).all() and (table < 0).all()
    params = json.dumps(jax_keys(saved.state["params"]))
    assert "lora_a" in params and "embedding" not in params and "/kernel/" not in params
    res = subprocess.run([sys.executable, "-m", "stack.tools.hf", "export", str(b / "checkpoints"),
                          "--out", str(tmp_path / "hf")],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "adapters only" in res.stderr and "--merge-adapters" in res.stderr, res.stderr


def jax_keys(tree, prefix="") -> list[str]:
    if isinstance(tree, dict):
        return [k for key, v in tree.items() for k in jax_keys(v, f"{prefix}/{key}")]
    return [prefix]


FULL_DISK = """import resource, runpy, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
sys.argv = ["stack", *sys.argv[1:]]
runpy.run_module("stack", run_name="__main__")"""


def test_a_failed_save_stops_with_one_paragraph_and_the_previous_step_restores(tmp_path):
    """Issue 15, items 4 and 8b: a save that cannot be written (files over RLIMIT_FSIZE) is never
    restored; the run stops with the step, the path and the OS error, exit 1."""
    run_dir = tmp_path / "run"
    args = ARGS[:4] + ["trainer.steps=7", "logger=jsonl", "trainer.eval_batches=1", f"run_dir={run_dir}"]
    assert run_cli(args, cwd=str(tmp_path)).returncode == 0  # step 7 saved
    longer = [a.replace("trainer.steps=7", "trainer.steps=14") for a in args]
    res = subprocess.run([sys.executable, "-c", FULL_DISK, *longer], cwd=str(tmp_path), capture_output=True, text=True,
                         env={**os.environ, "WANDB_SILENT": "true"}, timeout=300)
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 1 and last.startswith(f"error: checkpoint step 14 could not be written to {run_dir}"), \
        res.stderr[-3000:]
    assert "File too large (errno 27)" in last and "step 7 there still restores" in last, last
    assert len(res.stderr.strip().splitlines()) <= 5, res.stderr[-3000:]
    assert "[absl]" not in res.stdout and len(res.stdout.strip().splitlines()) <= 3, res.stdout[-3000:]
    log = (run_dir / "run.log").read_text()  # Orbax's own account, at full detail, is kept there
    assert "[absl][ERROR]" in log and "File too large" in log and "Traceback" in log
    res = run_cli(longer, cwd=str(tmp_path))
    assert res.returncode == 0 and "resumed after step 7" in res.stdout, res.stderr[-3000:]
