"""stack.launch.report on a sweep dir laid out as Hydra and stack write it, and the Optuna sweeper's
search space from Hydra's sweep syntax."""

import csv
import json
import os

import optuna.distributions as d
import pytest
import yaml

from stack.checkpoint.job_status import FILE, REFUSED, write_status
from stack.errors import ConfigError
from stack.launch.report import main as report_main
from stack.launch.report import read_sweep, report, table
from stack.launch.report_files import replaced
from stack.launch.sweeper import open_study, search_space


def job(root, name, overrides, metric, values, status=None):
    (root / name / ".hydra").mkdir(parents=True)
    (root / name / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    with open(root / name / "metrics.jsonl", "w") as f:
        for step, v in enumerate(values):
            f.write(json.dumps({"step": 10 * step, metric: v, "train/loss": 1.0}) + "\n")
    if status:
        write_status(str(root / name), status, objective=metric, value=values[-1] if values else None, seconds=2.5)


def test_table_sorts_by_the_objective_and_shows_only_varying_overrides(tmp_path):
    metric = "eval/rewards/accuracies"  # larger is better: the best job first
    job(tmp_path, "0", ["algorithm.beta=0.1", "seed=0"], metric, [0.5, 0.7, 0.6], "completed")
    job(tmp_path, "1", ["algorithm.beta=0.5053540542751055", "seed=0"], metric, [0.5, 0.9], "completed")  # Optuna's
    job(tmp_path, "2", ["algorithm.beta=0.9", "seed=0"], metric, [0.5], None)  # killed: no status
    job(tmp_path, "10", ["algorithm.beta=0.3", "seed=0"], metric, [], "failed")
    jobs = read_sweep(str(tmp_path))
    assert [j.name for j in jobs] == ["0", "1", "2", "10"]  # job order, numerically
    lines = table(jobs).splitlines()
    assert lines[0].split() == ["job", "algorithm.beta", f"{metric}", "(final)", "best", "status", "seconds"]
    assert [line.split()[0] for line in lines[1:]] == ["1", "0", "2", "10"]
    assert [line.split()[1] for line in lines[1:]] == ["0.5054", "0.1", "0.9", "0.3"]  # 4 significant digits
    assert lines[2].split()[2:] == ["0.6", "0.7", "completed", "2.5"]  # final 0.6, best 0.7 (max)
    assert lines[3].split()[-2:] == ["unfinished", "-"]
    text = report(str(tmp_path))
    assert "wrote summary.csv, curves.png" in text
    with open(tmp_path / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["algorithm.beta"], r["status"]) for r in rows] == [
        ("1", "0.5053540542751055", "completed"), ("0", "0.1", "completed"), ("2", "0.9", "unfinished"),
        ("10", "0.3", "failed")]  # exact


def test_a_refused_rerun_shows_until_the_dirs_run_writes_its_status_again(tmp_path):
    job(tmp_path, "0", ["seed=0"], "eval/loss", [3.0, 2.0], "completed")
    os.utime(tmp_path / "0" / FILE, (1e9, 1e9))  # written long before the rerun
    write_status(str(tmp_path / "0"), "refused", file=REFUSED, error="RunDirRefused: holds a completed run")
    (refused,) = read_sweep(str(tmp_path))
    assert (refused.status, refused.error, refused.final) == ("refused", "RunDirRefused: holds a completed run", 2.0)
    write_status(str(tmp_path / "0"), "completed", objective="eval/loss", value=2.0)  # e.g. the holder finished
    assert read_sweep(str(tmp_path))[0].status == "completed"


def test_a_job_without_metrics_jsonl_shows_the_objective_its_status_holds(tmp_path):
    """logger=[console] writes no metrics.jsonl: the final objective still comes from status.json
    (no curve, so no best); another metric has nothing to show."""
    job(tmp_path, "0", ["seed=0"], "eval/loss", [3.0, 2.5], status="completed")
    (tmp_path / "0" / "metrics.jsonl").unlink()
    (only,) = read_sweep(str(tmp_path))
    assert (only.final, only.best, only.curve) == (2.5, None, [])
    assert read_sweep(str(tmp_path), metric="eval/accuracy")[0].final is None


def test_losses_sort_ascending_and_the_metric_can_be_chosen(tmp_path):
    job(tmp_path, "0", ["optimizer.lr=1e-3"], "eval/loss", [3.0, 2.0], "completed")
    job(tmp_path, "1", ["optimizer.lr=1e-2"], "eval/loss", [3.0, 1.5, 2.5], "completed")
    assert [j.name for j in sorted(read_sweep(str(tmp_path)), key=lambda j: j.final)] == ["0", "1"]
    assert table(read_sweep(str(tmp_path))).splitlines()[1].split()[:4] == ["0", "1e-3", "2", "2"]
    train = read_sweep(str(tmp_path), metric="train/loss")
    assert [j.final for j in train] == [1.0, 1.0] and train[0].objective == "train/loss"
    with pytest.raises(ConfigError, match=r"holds no Hydra jobs \(subdirs with \.hydra/overrides\.yaml\): it is one "
                                          r"run's dir; give the multirun dir of a sweep"):
        read_sweep(str(tmp_path / "0"))
    with pytest.raises(ConfigError, match=r"holds no Hydra jobs \(subdirs with \.hydra/overrides\.yaml\)\.$"):
        read_sweep(str(tmp_path / "0" / ".hydra"))


def test_a_bad_sweep_dir_is_one_line_and_exit_2(tmp_path, capsys):
    """As every stack command given a bad argument (stack.tools.generate, stack.tools.hf, python -m stack)."""
    with pytest.raises(SystemExit) as info:
        report_main([str(tmp_path / "missing")])
    assert info.value.code == 2
    missing = str(tmp_path / "missing")
    assert capsys.readouterr().err == f"error: {missing!r} is not a directory (give a Hydra multirun sweep dir).\n"


def test_search_space_from_hydra_sweep_syntax():
    space, fixed = search_space(["optimizer.lr=tag(log,interval(1e-4,1e-2))", "seed=range(0,6,2)",
                                 "algorithm.beta=choice(0.1,0.5)", "data=a,b", "trainer.steps=20",
                                 "algorithm.label_smoothing=interval(0,0.5)"])
    assert space == {"optimizer.lr": d.FloatDistribution(1e-4, 1e-2, log=True),
                     "seed": d.IntDistribution(0, 4, step=2),
                     "algorithm.beta": d.CategoricalDistribution([0.1, 0.5]),
                     "data": d.CategoricalDistribution(["a", "b"]),
                     "algorithm.label_smoothing": d.FloatDistribution(0.0, 0.5)}
    assert fixed == ["trainer.steps=20"]
    with pytest.raises(ConfigError, match="found nothing to search"):
        search_space(["trainer.steps=20"])


def test_the_command_keeps_report_files_unless_overwrite_and_another_metric_has_its_own(tmp_path, capsys):
    """Issue 82 item 2: nothing is rewritten without being asked; `--metric X` writes summary-X.csv and
    curves-X.png beside the objective's files (it rewrote them)."""
    job(tmp_path, "0", ["seed=0"], "eval/loss", [3.0, 2.0], "completed")
    job(tmp_path, "1", ["seed=1"], "eval/loss", [3.0, 2.5], "completed")
    (tmp_path / "summary.csv").write_text("mine\n")
    report_main([str(tmp_path)])
    assert "kept summary.csv (they exist: --overwrite rewrites them)" in capsys.readouterr().out
    assert (tmp_path / "summary.csv").read_text() == "mine\n" and not (tmp_path / "curves.png").exists()
    report_main([str(tmp_path), "--metric", "train/loss"])
    assert "wrote summary-train_loss.csv, curves-train_loss.png" in capsys.readouterr().out
    assert (tmp_path / "summary.csv").read_text() == "mine\n"
    report_main([str(tmp_path), "--overwrite"])
    assert "wrote summary.csv, curves.png" in capsys.readouterr().out
    with open(tmp_path / "summary.csv") as f:
        assert [r["final"] for r in csv.DictReader(f)] == ["2.0", "2.5"]
    assert not [p for p in os.listdir(tmp_path) if "partial" in p]


def test_a_report_file_is_replaced_whole_or_not_at_all(tmp_path):
    (tmp_path / "summary.csv").write_text("old\n")
    with pytest.raises(RuntimeError), replaced(str(tmp_path / "summary.csv")) as tmp:
        with open(tmp, "w") as f:
            f.write("half")
        raise RuntimeError("killed mid-write")
    assert os.listdir(tmp_path) == ["summary.csv"] and (tmp_path / "summary.csv").read_text() == "old\n"


def test_a_damaged_job_dir_is_one_paragraph_naming_its_file(tmp_path, capsys):
    job(tmp_path, "0", ["seed=0"], "eval/loss", [3.0, 2.0], "completed")
    bad = tmp_path / "0" / ".hydra" / "overrides.yaml"
    bad.write_text('- !!python/object/apply:os.system ["touch ran"]\n')
    with pytest.raises(SystemExit) as info:
        report_main([str(tmp_path)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {str(bad)!r} cannot be read as a Hydra job's overrides (ConstructorError")
    assert not os.path.exists("ran")


def test_a_cut_metrics_line_and_a_damaged_study_db_do_not_hide_the_rest(tmp_path, capsys):
    job(tmp_path, "0", ["seed=0"], "eval/loss", [3.0, 2.0], "completed")
    with open(tmp_path / "0" / "metrics.jsonl", "a") as f:
        f.write('{"step": 20, "eval/lo')  # a kill mid-line
    (tmp_path / "optuna.db").write_bytes(b"\x00not sqlite" * 100)
    with pytest.warns(UserWarning, match=r"optuna.db cannot be read \(\(sqlite3.DatabaseError\) file is not a "
                                         r"database\): no Optuna plots"):
        report_main([str(tmp_path)])
    assert "wrote summary.csv, curves.png\n" in capsys.readouterr().out
    assert [j.curve for j in read_sweep(str(tmp_path))] == [[(0, 3.0), (10, 2.0)]]


@pytest.mark.parametrize("case", ["damaged", "locked"])
def test_a_study_db_that_cannot_be_opened_is_one_paragraph(tmp_path, case):
    import sqlite3

    db = tmp_path / "optuna.db"
    if case == "damaged":
        db.write_bytes(b"\x00not sqlite" * 100)
    else:
        open_study(str(tmp_path), "stack", "minimize", 0)
        holder = sqlite3.connect(db)
        holder.execute("BEGIN EXCLUSIVE")
    words = "it is not a study of this sweep" if case == "damaged" else "another sweep still running there holds it"
    with pytest.raises(ConfigError, match=f"The Optuna study 'stack' in '{db}' cannot be opened .*; {words}"):
        open_study(str(tmp_path), "stack", "minimize", 0)
