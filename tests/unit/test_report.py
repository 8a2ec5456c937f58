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
from stack.launch.sweeper import search_space


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
