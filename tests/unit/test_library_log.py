"""Library records go to the run dir's run.log at full detail, not the console; stack's and
Hydra's stay on the console (issue 82 item 5)."""

import logging

from stack.logging.library_log import library_log


def test_library_records_go_to_the_run_log_and_stacks_stay_on_the_console(tmp_path, capsys):
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)
    absl = logging.getLogger("absl")
    try:
        with library_log(str(tmp_path), rank=0) as path:
            console = logging.StreamHandler()  # added after the run started (jax adds one at import)
            root.addHandler(console)
            try:
                raise OSError(27, "File too large")
            except OSError:
                absl.exception("_SignalingThread.run() raised an exception")
            absl.info("Finished saving checkpoint")
            logging.getLogger("jax._src.xla_bridge").warning("a platform note")
            logging.getLogger("stack.checkpoint").warning("a warning of ours")
        absl.warning("after the run")
        assert (absl.propagate, absl.level, absl.handlers) == (True, logging.NOTSET, [])  # as before the run
    finally:
        root.removeHandler(console)
        root.setLevel(level)
    assert capsys.readouterr().err == "a warning of ours\nafter the run\n"
    log = (tmp_path / "run.log").read_text()
    assert path == str(tmp_path / "run.log")
    assert "[absl][ERROR] - _SignalingThread.run() raised an exception\nTraceback" in log
    assert "OSError: [Errno 27] File too large" in log and "[absl][INFO] - Finished saving checkpoint" in log
    assert "[jax._src.xla_bridge][WARNING] - a platform note" in log
    assert "of ours" not in log and "after the run" not in log


def test_a_run_without_library_records_writes_no_file_and_rank_1_has_its_own(tmp_path):
    with library_log(str(tmp_path / "run"), rank=1) as path:
        pass
    assert path == str(tmp_path / "run" / "run.rank1.log") and not (tmp_path / "run" / "run.rank1.log").exists()
