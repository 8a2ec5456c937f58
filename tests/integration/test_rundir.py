"""A run dir has one owner (stack/checkpoint/rundir.py): a second run is refused at once and writes
nothing; the lock of a killed run (kill -9) is taken over by the next one."""

import os
import subprocess
import sys

import pytest

from stack.checkpoint.rundir import owned
from stack.errors import ConfigError
from tests.helpers import QUICK, run_cli

HOLD = ("import sys, time; from stack.checkpoint.rundir import owned\nwith owned(sys.argv[1]):\n"
        " print('held', flush=True); time.sleep(120)")


def holder(run_dir) -> subprocess.Popen:
    """Another process that owns `run_dir` until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_is_refused_naming_the_holder_then_takes_over_after_kill_9(tmp_path, capsys):
    run_dir = tmp_path / "run"
    proc = holder(run_dir)
    try:
        res = run_cli([*QUICK, "trainer.steps=2", f"run_dir={run_dir}"], cwd=str(tmp_path))
        assert res.returncode == 2 and f"pid {proc.pid} on host" in res.stderr and "one owner" in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) <= 3 and os.listdir(run_dir) == [".lock"]  # wrote nothing
        with pytest.raises(ConfigError, match=f"in use by pid {proc.pid}"):
            with owned(str(run_dir)):
                pass
    finally:
        proc.kill()
        proc.wait()
    with owned(str(run_dir)):  # the kernel dropped the dead holder's lock
        assert f"pid {proc.pid} on host" in capsys.readouterr().out
        assert f"pid {os.getpid()} on host" in (run_dir / ".lock").read_text()
    assert (run_dir / ".lock").read_text() == ""  # a clean exit leaves no owner behind
    with owned(str(run_dir)):
        assert "taking the run dir over" not in capsys.readouterr().out


def test_ctrl_c_before_the_loop_is_one_line_and_exit_130(tmp_path):
    """SIGINT while the process imports, composes or builds: no traceback (issue 15, item 5)."""
    import signal
    import time

    from tests.integration.test_resume import start

    for delay in (0.5, 1.5):  # importing; composing or building (a 2-step run ends within ~3 s on a warm cache)
        proc = start([*QUICK, "trainer.steps=2", f"run_dir={tmp_path / str(delay)}"], str(tmp_path))
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and err.strip().splitlines() == ["interrupted (Ctrl-C)"], (delay, err[-2000:])
