"""WandbSink writes offline runs that read_offline_run reads back; online falls back to offline."""

import time
from pathlib import Path

import pytest
import wandb
from omegaconf import OmegaConf

from stack.config.schema.logger import LoggerConfig
from stack.logging.wandb_reader import read_offline_run
from stack.logging.wandb_sink import WandbSink

CONFIG = {"model": {"d_model": 64}, "optimizer": {"lr": 0.001}}


@pytest.fixture(autouse=True)
def isolated_wandb(tmp_path, monkeypatch):
    """Keeps wandb off the network and out of the home directory; fresh wandb per test."""
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_PROJECT", "WANDB_ENTITY",
                "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_RUN_GROUP"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for var, sub in (("WANDB_DIR", "wandb"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_DATA_DIR", "data"), ("WANDB_ARTIFACT_DIR", "artifacts")):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home" / sub))
    # wandb reads WANDB_* variables once per process (at its first init) until teardown.
    wandb.teardown()
    yield
    wandb.teardown()


def make_cfg(**overrides):
    return OmegaConf.structured(LoggerConfig(wandb=True, project="stack-test", tags=["unit"], **overrides))


def metrics(history, key):
    return [(row["_step"], row[key]) for row in history if key in row]


def test_offline_run_round_trips(tmp_path, capsys):
    sink = WandbSink(make_cfg(), str(tmp_path / "job"), CONFIG, group="sweep-1", name="job-0")
    sink.log(0, {"train/loss": 2.5})
    sink.log(10, {"train/loss": 1.25})
    sink.log(20, {"train/loss": 0.123456789, "eval/loss": 0.75})
    sink.close(summary={"eval/best_loss": 0.75, "tokens": 12345})
    assert capsys.readouterr().out.splitlines()[-1] == (f"wandb: offline run {sink.run_id} in {sink.run_dir}; "
                                                        f"upload it with: wandb sync {sink.run_dir}")

    assert Path(sink.run_dir).name.startswith("offline-run-") and sink.run_id in sink.run_dir
    run = read_offline_run(tmp_path / "job")
    assert run["id"] == sink.run_id
    assert run["config"] == CONFIG
    assert run["group"] == "sweep-1"
    assert [row["_step"] for row in run["history"]] == [0, 10, 20]
    assert metrics(run["history"], "train/loss") == [(0, 2.5), (10, 1.25), (20, 0.123456789)]
    assert metrics(run["history"], "eval/loss") == [(20, 0.75)]
    assert run["summary"]["eval/best_loss"] == 0.75 and run["summary"]["tokens"] == 12345
    assert run["summary"]["train/loss"] == 0.123456789  # last logged value
    assert read_offline_run(sink.run_dir) == run == read_offline_run(Path(sink.run_dir) / f"run-{sink.run_id}.wandb")


def test_group_is_none_when_not_given(tmp_path):
    sink = WandbSink(make_cfg(), str(tmp_path), {"a": 1})
    sink.close()
    run = read_offline_run(tmp_path)
    assert run["group"] is None and run["history"] == [] and run["config"] == {"a": 1}


def test_sequential_sinks_are_independent_runs(tmp_path):
    runs = []
    for job, lr in enumerate([0.1, 0.2]):
        sink = WandbSink(make_cfg(), str(tmp_path / str(job)), {"optimizer": {"lr": lr}}, group="sweep")
        for step in range(3):
            sink.log(step, {"train/loss": lr * (3 - step)})
        sink.close(summary={"final": lr})
        runs.append((sink.run_id, read_offline_run(sink.run_dir)))

    (id0, run0), (id1, run1) = runs
    assert id0 != id1 and (run0["id"], run1["id"]) == (id0, id1)
    assert run0["config"] == {"optimizer": {"lr": 0.1}} and run1["config"] == {"optimizer": {"lr": 0.2}}
    assert metrics(run0["history"], "train/loss") == [(0, 0.1 * 3), (1, 0.1 * 2), (2, 0.1 * 1)]
    assert metrics(run1["history"], "train/loss") == [(0, 0.2 * 3), (1, 0.2 * 2), (2, 0.2 * 1)]
    assert (run0["summary"]["final"], run1["summary"]["final"]) == (0.1, 0.2)
    assert read_offline_run(tmp_path / "0") == run0  # the second run did not touch the first


def test_resume_with_run_id_continues_in_a_new_offline_folder(tmp_path):
    first = WandbSink(make_cfg(), str(tmp_path), CONFIG)
    first.log(0, {"train/loss": 1.0})
    first.close()
    second = WandbSink(make_cfg(), str(tmp_path), CONFIG, run_id=first.run_id)
    second.log(1, {"train/loss": 0.5})
    second.close()

    assert second.run_id == first.run_id and second.run_dir != first.run_dir
    assert metrics(read_offline_run(tmp_path)["history"], "train/loss") == [(1, 0.5)]  # newest folder
    assert metrics(read_offline_run(first.run_dir)["history"], "train/loss") == [(0, 1.0)]


def test_disabled_mode_writes_nothing(tmp_path):
    sink = WandbSink(make_cfg(mode="disabled"), str(tmp_path / "job"), CONFIG)
    sink.log(0, {"train/loss": 1.0})
    sink.close(summary={"x": 1.0})
    assert sink.run_dir is None
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_online_without_network_falls_back_to_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567")  # fake, 40 chars
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # closed local port
    cfg = make_cfg(mode="online", init_timeout=2.0)

    start = time.monotonic()
    with pytest.warns(RuntimeWarning,
                      match=r"falling back to offline run fallback1: upload it later with `wandb sync "):
        sink = WandbSink(cfg, str(tmp_path / "job"), CONFIG, run_id="fallback1")
    assert time.monotonic() - start < 15  # bounded by init_timeout (was 27-30 s whatever it said)
    sink.log(0, {"train/loss": 1.5})
    sink.log(10, {"train/loss": 0.5})
    sink.close(summary={"best": 0.5})

    assert sink.run_id == "fallback1" and Path(sink.run_dir).name.startswith("offline-run-")
    run = read_offline_run(tmp_path / "job")
    assert run["id"] == "fallback1" and run["config"] == CONFIG
    assert metrics(run["history"], "train/loss") == [(0, 1.5), (10, 0.5)]
    assert run["summary"]["best"] == 0.5


def test_reader_stops_at_a_truncated_tail_and_rejects_corruption(tmp_path):
    sink = WandbSink(make_cfg(), str(tmp_path / "job"), CONFIG)
    for step in range(5):
        sink.log(step, {"train/loss": float(step)})
    sink.close()
    data = (Path(sink.run_dir) / f"run-{sink.run_id}.wandb").read_bytes()

    truncated = tmp_path / "truncated.wandb"
    truncated.write_bytes(data[: data.rindex(b"train/loss") - 10])  # cuts into the last history record
    assert [row["_step"] for row in read_offline_run(truncated)["history"]] == [0, 1, 2, 3]

    corrupt = tmp_path / "corrupt.wandb"
    at = data.index(b"d_model")
    corrupt.write_bytes(data[:at] + b"D" + data[at + 1 :])
    with pytest.raises(ValueError, match="corrupt record"):
        read_offline_run(corrupt)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError):
        read_offline_run(tmp_path / "empty")


def test_new_sink_is_a_new_run_even_if_the_previous_one_was_not_closed(tmp_path):
    crashed = WandbSink(make_cfg(), str(tmp_path / "crashed"), {"job": 0})
    crashed.log(0, {"train/loss": 9.0})
    sink = WandbSink(make_cfg(), str(tmp_path / "next"), {"job": 1})
    sink.log(0, {"train/loss": 1.0})
    sink.close()
    crashed.close()

    assert sink.run_id != crashed.run_id
    assert metrics(read_offline_run(sink.run_dir)["history"], "train/loss") == [(0, 1.0)]
    assert metrics(read_offline_run(crashed.run_dir)["history"], "train/loss") == [(0, 9.0)]
