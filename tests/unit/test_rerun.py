"""Running again in a run dir: a killed run's rows go, a completed run is never started over on
top of, and a run with nothing left to train says so."""

import math

import pytest

from stack.checkpoint.job_status import write_status
from stack.engine.summary import Summary
from stack.engine.trainer import train
from stack.errors import ConfigError
from stack.run.build import build
from stack.run.modes import describe
from tests.helpers import make_cfg, read_metrics

TINY = ["model.d_model=32", "model.n_heads=2", "model.n_kv_heads=1", "model.d_ff=64", "model.n_layers=1",
        "data.batch_size=8", "trainer.eval_batches=1", "logger=jsonl", "checkpoint=none", "trainer.steps=2",
        "trainer.log_every=1"]


def test_a_fresh_start_drops_the_rows_of_a_killed_run_that_saved_no_checkpoint(tmp_path):
    clean, reused = tmp_path / "clean", tmp_path / "reused"
    clean.mkdir()
    reused.mkdir()
    (reused / "metrics.jsonl").write_text("".join(f'{{"step": {s}, "train/loss": 9.0}}\n' for s in range(7)))
    for run_dir in (clean, reused):  # the killed run left no status.json
        train(build(make_cfg(TINY + [f"run_dir={run_dir}"]), str(run_dir)))
    rows = lambda run_dir: [{k: v for k, v in r.items() if not k.startswith("perf/")}  # noqa: E731
                            for r in read_metrics(run_dir)]  # (perf/*: timings)
    assert rows(reused) == rows(clean) and [r["step"] for r in rows(clean)] == [0, 1, 2]


def test_a_completed_run_without_a_checkpoint_to_resume_is_not_started_over(tmp_path):
    rows = '{"step": 2, "train/loss": 1.5}\n'
    (tmp_path / "metrics.jsonl").write_text(rows)
    write_status(str(tmp_path), "completed", step=2)
    with pytest.raises(ConfigError) as info:
        build(make_cfg(TINY + [f"run_dir={tmp_path}"]), str(tmp_path))
    msg = str(info.value)
    assert "holds a completed run" in msg and "another run_dir" in msg and "\n" not in msg
    assert (tmp_path / "metrics.jsonl").read_text() == rows


def test_a_completed_run_is_refused_before_the_model_is_built(tmp_path):
    """The refusal needs no model: a model source that would fail to load is never reached."""
    write_status(str(tmp_path), "completed", step=2)
    cfg = make_cfg(TINY + [f"run_dir={tmp_path}", f"model.init_from=hf:{tmp_path}/no_such_hf_dir"])
    with pytest.raises(ConfigError, match="holds a completed run"):
        build(cfg, str(tmp_path))
    (tmp_path / "status.json").unlink()  # the same config on a fresh dir fails on the model source
    with pytest.raises(ConfigError, match="no_such_hf_dir"):
        build(cfg, str(tmp_path))


def test_a_run_resumed_at_its_last_step_says_there_is_nothing_to_train():
    s = Summary("completed", first_step=21, final_step=20, train={}, eval={"eval/loss": 4.71},
                eval_history=((20, {"eval/loss": 4.71}),), perf={}, run_dir="/runs/a", checkpoint=None)
    line = describe(s, "eval/loss")
    assert "nothing to train" in line and "step 20" in line and "eval/loss 4.7100" in line
    assert str(math.nan) not in line
    ran = describe(Summary("completed", 21, 30, {"train/loss": 1.0}, {}, (), {}, "/runs/a", None), "eval/loss")
    assert "resumed after step 20" in ran and "train/loss 1.0000" in ran
