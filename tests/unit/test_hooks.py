"""Each trainer hook alone, on a hand-made run record (the real Orbax checkpointer included)."""

import os
import signal
import threading
import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from stack.checkpoint.manager import Checkpointer
from stack.engine.trainer.checkpointing import Checkpointing
from stack.engine.trainer.context import COMPLETED, NONFINITE, PREEMPTED, RUNNING, Clock
from stack.engine.trainer.metrics import MetricsLog
from stack.engine.trainer.nonfinite import NonFinite
from stack.engine.trainer.save_overlap import SaveThread, copy_fits
from stack.engine.trainer.signals import Signals
from stack.errors import ConfigError
from tests.helpers import make_cfg


class State:
    def __init__(self, value: float):
        self.value = value

    def saved(self):
        return {"params": {"w": jnp.full((3,), self.value)}, "step": jnp.int32(0)}


def record(steps: int = 10, step: int = 0) -> SimpleNamespace:
    """The fields of stack.engine.trainer.context.Run that the hooks read."""
    run = SimpleNamespace(step=step, total_steps=steps, status=RUNNING, message="", checkpoint=None, columns=None,
                          signal=None, clock=Clock(), state=State(0.0), data_state={"next_index": step}, train={},
                          exp=SimpleNamespace(wandb_id=None))
    run.done = False
    return run


def test_a_window_of_one_step_logs_its_values_exactly():
    """log_every=1: each row is the step's own values (a float32 loss, an int token count), as
    numpy's mean of one value gives them, and as host numbers."""
    feed = SimpleNamespace(batches=SimpleNamespace(epoch=lambda state: 0.0))
    hook, run, loss = MetricsLog(feed), record(), np.float32(1.1)
    hook.after_step(run, {"loss": jnp.float32(loss), "loss_tokens": jnp.int32(7), "lr": jnp.float32(0.5)}, {})
    row = {}
    hook.log(run, [(row, hook.take(run))])
    assert row["train/loss"] == float(np.mean([loss])) == float(loss) != 1.1
    assert row["train/loss_tokens"] == 7.0 and row["train/lr"] == 0.5 and "train/train/lr" not in row
    assert all(type(v) is float for v in row.values()) and hook.window == []


def test_clock_leaves_paused_spans_out():
    clock = Clock()
    start = clock.now()
    with clock.paused():
        time.sleep(0.2)
    assert clock.now() - start < 0.1


def test_nonfinite_stops_at_the_first_bad_loss_and_ignore_does_not():
    run, guard = record(), NonFinite("stop")
    for step, loss in ((1, 2.0), (2, float("nan")), (3, 1.0)):
        run.step = step
        guard.after_step(run, {"loss": jnp.float32(loss)}, {})
    assert guard.check(run) is False and run.status == NONFINITE
    assert "non-finite (nan) at step 2" in run.message and "no checkpoint was saved" in run.message
    run, lenient = record(), NonFinite("ignore")
    lenient.after_step(run, {"loss": jnp.float32(float("inf"))}, {"train/loss": float("inf")})
    assert lenient.check(run) and run.status == RUNNING


def test_checkpoints_fall_where_a_round_crosses_the_cadence(tmp_path):
    """Round ends at steps 4, 8, 12, 14, 18 with checkpoint.every=3: a save where a round crossed
    a multiple of 3 (4, 8, 12), none at 14 (nothing crossed since 12), and the last step."""
    cfg = make_cfg(["checkpoint=local", "checkpoint.every=3", "checkpoint.keep=10", "trainer.steps=18"])
    ckpt = Checkpointer(cfg, str(tmp_path))
    hook, run = Checkpointing(ckpt, NonFinite("stop")), record(steps=18)
    hook.on_start(run)
    for step in (4, 8, 12, 14, 18):
        run.step, run.done, run.state = step, step == 18, State(float(step))
        hook.after_round(run)
    hook.on_end(run)
    ckpt.close()
    assert ocp.CheckpointManager(str(tmp_path / "checkpoints")).all_steps() == [4, 8, 12, 18]
    assert run.checkpoint == f"{tmp_path}/checkpoints/18"


def test_no_checkpoint_after_a_nonfinite_loss_and_a_blocking_one_when_preempted(tmp_path):
    cfg = make_cfg(["checkpoint=local", "checkpoint.every=1", "trainer.steps=10"])
    ckpt = Checkpointer(cfg, str(tmp_path))
    guard = NonFinite("stop")
    hook, run = Checkpointing(ckpt, guard), record()
    run.step = 1
    guard.after_step(run, {"loss": jnp.float32(float("nan"))}, {})
    hook.after_round(run)
    assert run.status == NONFINITE and not os.path.exists(tmp_path / "checkpoints" / "1")
    run.status, run.step = PREEMPTED, 2
    hook.after_round(run)  # a blocking save: on disk when the call returns
    assert os.path.isdir(tmp_path / "checkpoints" / "2")
    ckpt.close()


def test_an_overlapped_save_holds_its_step_while_the_next_step_donates_the_live_state(tmp_path):
    """The save runs in a thread on a device copy: the loop goes on at once, the next (donating)
    step deletes the live buffers, and the checkpoint still holds the values of the saved step."""
    cfg = make_cfg(["checkpoint=local", "checkpoint.every=1", "trainer.steps=10"])
    ckpt = Checkpointer(cfg, str(tmp_path))
    hook, run = Checkpointing(ckpt, NonFinite("stop"), overlap=True), record()
    state = {"params": {"w": jnp.arange(2**20, dtype=jnp.float32)}, "step": jnp.int32(3)}
    hook.save(3, state, {"next_index": 3}, {}, ckpt.tiers)
    stepped = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)(state)
    assert state["params"]["w"].is_deleted() and float(stepped["params"]["w"][0]) == 1.0
    hook.on_end(run)
    ckpt.close()
    saved = ocp.CheckpointManager(str(tmp_path / "checkpoints")).restore(
        3, args=ocp.args.Composite(state=ocp.args.StandardRestore())).state
    np.testing.assert_array_equal(saved["params"]["w"], np.arange(2**20, dtype=np.float32))
    assert int(saved["step"]) == 3


def test_overlap_by_default_only_where_a_copy_of_the_state_fits():
    state = {"w": jnp.zeros((2**20,), jnp.float32)}  # 4 MiB
    mib = 2**20
    assert copy_fits(state, {"bytes_limit": 100 * mib, "peak_bytes_in_use": 95 * mib})[0]
    fits, why = copy_fits(state, {"bytes_limit": 100 * mib, "peak_bytes_in_use": 97 * mib})
    assert not fits and why == "a copy of the state needs 4 MiB per device, 3 MiB are free"
    assert copy_fits(state)[0]  # CPU: no device memory limit


def test_no_overlap_with_several_processes_and_a_clear_error_when_forced(monkeypatch, capsys):
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    hook = Checkpointing(None, NonFinite("stop"))
    assert not hook._overlaps({"w": jnp.zeros(4)})
    out = capsys.readouterr().out
    assert "several processes" in out and "overlap=true forces" not in out
    with pytest.raises(ConfigError, match=r"checkpoint.overlap=true with 2 processes.*deadlock"):
        Checkpointing(None, NonFinite("stop"), overlap=True)


def test_a_failed_save_thread_raises_at_the_next_join_once():
    thread = SaveThread()
    thread.start(lambda: open("/nonexistent/dir/file", "w"))
    with pytest.raises(FileNotFoundError):
        thread.join()
    thread.join()  # reported once


def test_saves_run_one_after_another_on_one_worker_thread_that_close_ends():
    thread, seen = SaveThread(), []
    for i in range(3):
        thread.start(lambda i=i: seen.append((i, threading.current_thread())))
    thread.close()
    assert [i for i, _ in seen] == [0, 1, 2]
    workers = {t for _, t in seen}
    assert len(workers) == 1 and threading.main_thread() not in workers
    assert not any(t.is_alive() for t in workers)


def test_signals_turn_into_a_preemption_at_the_round_end():
    hook, run = Signals(), record()
    before = signal.getsignal(signal.SIGTERM)
    hook.on_start(run)
    os.kill(os.getpid(), signal.SIGTERM)
    assert run.status == RUNNING  # nothing happens until the round ends
    run.step = 7
    hook.after_round(run)
    hook.on_end(run)
    assert run.status == PREEMPTED and run.signal == signal.SIGTERM
    assert run.message == f"preempted by signal {int(signal.SIGTERM)} after step 7"
    assert signal.getsignal(signal.SIGTERM) == before


def test_metrics_window_means_at_logging_steps():
    """Means over the steps since the last logging step; lr and data epoch of the window's last
    step; two rows held until one wait get their own windows."""
    feed = SimpleNamespace(batches=SimpleNamespace(epoch=lambda state: state["next_index"] / 100))
    hook, run = MetricsLog(feed), record()
    rows, held = [], []
    for step, loss in ((1, 4.0), (2, 2.0), (3, 1.0), (4, 3.0)):
        run.step, run.data_state, row = step, {"next_index": step * 8}, {}
        hook.after_step(run, {"loss": jnp.float32(loss), "lr": jnp.float32(step / 10)}, row)
        assert row == {}  # nothing is fetched when the step is dispatched
        if step % 2 == 0:
            held.append((row, hook.take(run)))
        run.data_state = {"next_index": 99}  # the next round's: the row keeps its own step's
        rows.append(row)
    hook.log(run, held)
    assert rows[1]["train/loss"] == 3.0 and rows[3]["train/loss"] == 2.0 and "train/lr" in rows[1]
    assert rows[1]["data/epoch"] == 0.16 and np.isclose(rows[1]["train/lr"], 0.2)
    assert rows[3]["data/epoch"] == 0.32 and np.isclose(rows[3]["train/lr"], 0.4)
    assert run.train["train/loss"] == 2.0 and run.status != COMPLETED
