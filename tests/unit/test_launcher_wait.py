"""`launcher=local`'s wait for its ranks (stack.launch.local.wait_all), on real child processes: the
first failing rank stops the others and gives the job its exit code."""

import os
import subprocess
import sys
import time

from stack.launch.local import job_dir, shell_code, wait_all


def child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_the_first_failing_rank_stops_the_others_and_names_the_exit_code():
    ranks = [child("import time; time.sleep(60)"), child("import sys; sys.exit(3)")]
    assert wait_all(ranks, grace=5) == 3
    assert ranks[0].returncode == -15  # stopped by the launcher's SIGTERM, not left running


def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace():
    ranks = [child("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"),
             child("import sys, time; time.sleep(0.5); sys.exit(2)")]  # after the other ignores SIGTERM
    assert wait_all(ranks, grace=0.5) == 2 and ranks[0].returncode == -9


def test_all_ranks_ok_is_0_and_a_signal_reads_as_the_shell_says():
    assert wait_all([child("pass"), child("pass")], grace=1) == 0
    assert shell_code(-9) == 137 and shell_code(-15) == 143 and shell_code(1) == 1


def test_launcher_local_takes_hydra_run_dir_as_run_dir(tmp_path, monkeypatch):
    """`hydra.run.dir=` (the Hydra way) and `run_dir=` name the same dir; it wrote under ./outputs/.
    The default dir is claimed: two jobs started in the same second get one each (issue 81)."""
    assert job_dir(None, ["launcher=local", "hydra.run.dir=/runs/a", "trainer.steps=5"]) == "/runs/a"
    assert job_dir("/runs/b", ["hydra.run.dir=/runs/a"]) == "/runs/b"
    assert job_dir(None, ["hydra.run.dir=runs/${now:%Y}/x"]) == f"runs/{time.strftime('%Y')}/x"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda form: "2026-12-07" if "Y" in form else "10-00-00")  # one second
    assert [job_dir(None, []) for _ in range(3)] == ["outputs/2026-12-07/10-00-00", "outputs/2026-12-07/10-00-00-1",
                                                      "outputs/2026-12-07/10-00-00-2"]
    assert sorted(os.listdir(tmp_path / "outputs" / "2026-12-07")) == ["10-00-00", "10-00-00-1", "10-00-00-2"]
