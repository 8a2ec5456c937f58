"""The sinks a `logger` list turns on: the console (tqdm's bar on a terminal, grouped progress rows
off it), metrics.jsonl, and TensorBoard event files read back by TensorBoard's own reader."""

import contextlib
import fcntl
import io
import os
import select
import struct
import termios
import time

import pytest

from stack.cli.api import compose
from stack.logging.console import ConsoleSink
from stack.logging.rows import row_lines
from stack.logging.sinks import JsonlSink
from stack.logging.tensorboard_sink import TensorBoardSink
from stack.run.build import make_sinks
from tests.helpers import read_metrics, tensorboard_scalars


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


DPO_EVAL = {"eval/loss": 0.6931, "eval/rewards/chosen": 0.12, "eval/rewards/rejected": -0.05,
            "eval/rewards/margins": 0.17, "eval/logps/chosen": -30.5, "eval/logps/rejected": -31.25}


def test_a_row_is_a_line_per_prefix_the_shortest_first():
    assert row_lines("step 20", DPO_EVAL) == [
        "step 20  eval: loss 0.6931",
        "  eval/logps: chosen -30.5000 rejected -31.2500",
        "  eval/rewards: chosen 0.1200 margins 0.1700 rejected -0.0500",
    ]
    assert row_lines("step 20", {"train/loss": 2.0, "train/lr": 3e-4, "train/grad_norm": 1.5}, inline=False) == [
        "step 20", "  train: loss 2.0000 grad_norm 1.5000 lr 3.000e-04"]


def test_a_long_group_wraps_under_100_characters():
    lines = row_lines("step 3", {f"eval/reward/fn_{i:02d}": 0.5 for i in range(20)})
    assert len(lines) == 3 and all(len(line) <= 100 for line in lines)
    assert lines[1].startswith("    fn_") and " ".join(lines).count(" 0.5000") == 20


def test_on_a_terminal_tqdm_draws_the_bar_and_eval_rows_print_above_it():
    tty = Tty()
    sink = ConsoleSink(total_steps=20, stream=tty)
    sink.log(10, {"train/loss": 2.5, "perf/tokens_per_sec": 1000.0})
    sink.log(20, {"train/loss": 2.0, "perf/tokens_per_sec": 1000.0, **DPO_EVAL})
    sink.close()
    out = tty.getvalue()
    assert "| 10/20 [" in out and "loss 2.5000, 1,000 tok/s]" in out  # tqdm's bar: elapsed<ETA, the postfix
    assert "| 20/20 [" in out and "\rstep 20  eval: loss 0.6931\n  eval/logps:" in out
    assert "\n  train:" not in out  # the bar carries the train rows


@pytest.mark.parametrize("rows, cols", [(0, 0), (0, 90), (30, 90)], ids=["unsized", "no_lines", "sized"])
def test_a_pty_of_any_reported_size_gets_a_drawn_bar(rows, cols):
    """tqdm draws nothing in a terminal that reports 0 lines (launcher=local's relay pty, `script`):
    such a pty gets a 100-column bar; a sized one tqdm's own width."""
    master, replica = os.openpty()
    fcntl.ioctl(replica, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    with os.fdopen(replica, "w") as stream:
        sink = ConsoleSink(total_steps=4, stream=stream)
        for step in (2, 4):
            sink.log(step, {"train/loss": 1.0, "perf/tokens_per_sec": 10.0})
        sink.close()
    out = b""
    with contextlib.suppress(OSError):  # EIO: the replica is closed and everything is read
        while select.select([master], [], [], 0.5)[0]:  # what the pty holds, however it is chunked
            out += os.read(master, 1 << 16)
    os.close(master)
    out = out.decode()
    assert "4/4 [" in out and "loss 1.0000, 10 tok/s" in out, out
    assert max(len(line) for line in out.replace("\r", "\n").splitlines()) <= (cols or 100)


def test_off_a_terminal_progress_rows_with_eta_every_interval_and_at_the_last_step():
    pipe = io.StringIO()
    sink = ConsoleSink(total_steps=30, interval=3600, stream=pipe)
    sink.log(10, {"train/loss": 3.0, "perf/tokens_per_sec": 900.0})
    sink.start = (10, time.monotonic() - 10.0)  # 10 steps took 10 s
    sink.log(20, {"train/loss": 2.5, "perf/tokens_per_sec": 1000.0})  # within the interval: no row
    sink.log(30, {"train/loss": 2.0, "train/lr": 1e-3, "perf/tokens_per_sec": 1000.0})
    sink.close()
    assert pipe.getvalue().splitlines() == [
        "step 10/30 (33%, eta ?, 900 tok/s)", "  train: loss 3.0000",
        "step 30/30 (100%, eta 00:00, 1,000 tok/s)", "  train: loss 2.0000 lr 0.0010"]
    assert "\r" not in pipe.getvalue()
    sink = ConsoleSink(total_steps=30, interval=0, stream=(pipe := io.StringIO()))
    sink.start = (10, time.monotonic() - 10.0)
    sink.log(20, {"train/loss": 2.5})
    assert pipe.getvalue().startswith("step 20/30 (66%, eta 00:10, 0 tok/s)")  # 10 steps left at 1 step/s


def test_progress_false_prints_eval_rows_only():
    pipe = io.StringIO()
    sink = ConsoleSink(total_steps=20, progress=False, interval=0, stream=pipe)
    sink.log(10, {"train/loss": 2.5})
    sink.log(20, {"train/loss": 2.0, "eval/loss": 2.2})
    assert pipe.getvalue() == "step 20  eval: loss 2.2000\n"


def test_jsonl_one_object_per_logged_step(tmp_path):
    sink = JsonlSink(str(tmp_path))
    sink.log(0, {"eval/loss": 3.0})
    sink.log(5, {"train/loss": float("nan")})
    sink.close()
    rows = read_metrics(tmp_path)
    assert rows == [{"step": 0, "eval/loss": 3.0}, {"step": 5, "train/loss": "nan"}]


def test_tensorboard_reads_the_scalars_back_and_drops_what_a_rewind_forgets(tmp_path, capsys):
    sink = TensorBoardSink(str(tmp_path))
    for step in range(1, 6):
        sink.log(step, {"train/loss": 1.0 / step, "perf/tokens_per_sec": 100.0 * step})
    sink.close()  # a killed run got to step 5, its checkpoint is step 3
    sink = TensorBoardSink(str(tmp_path))
    sink.rewind(3)
    for step in (4, 5, 6):
        sink.log(step, {"train/loss": 10.0 + step})
    sink.close()
    assert tensorboard_scalars(tmp_path / "tensorboard", "train/loss") == pytest.approx(
        {1: 1.0, 2: 0.5, 3: 1 / 3, 4: 14.0, 5: 15.0, 6: 16.0})
    assert tensorboard_scalars(tmp_path / "tensorboard", "perf/tokens_per_sec") == {1: 100.0, 2: 200.0, 3: 300.0}
    assert capsys.readouterr().out.endswith(f"view them with: tensorboard --logdir {tmp_path / 'tensorboard'}\n")


@pytest.mark.parametrize("overrides, kinds", [
    ([], ["ConsoleSink", "JsonlSink"]),
    (["+logger=tensorboard"], ["ConsoleSink", "JsonlSink", "TensorBoardSink"]),
    (["logger=[jsonl,tensorboard]"], ["JsonlSink", "TensorBoardSink"]),
    (["logger=[]"], []),
])
def test_the_logger_list_picks_the_sinks(tmp_path, overrides, kinds):
    sinks = make_sinks(compose(overrides), str(tmp_path), group=None, name=None)
    assert [type(s).__name__ for s in sinks] == kinds
    for sink in sinks:
        sink.close()
