"""`python -m bench`'s table: the rows benches print are read back, judged against their goals
(bounds included or not as written), and every line ends with ok or miss."""

import os
import re

import pytest

from bench.__main__ import BENCHES, table
from bench.rows import emit, holds, parse


@pytest.mark.parametrize("ratio, goal, want", [(0.05, "<= 0.05", True), (0.051, "<= 0.05", False),
                                               (0.5, "< 0.5", False), (0.49, "< 0.5", True),
                                               (5.0, ">= 5", True), (4.9, ">= 5", False), (1.0, "> 1", False)])
def test_a_goal_holds_as_written(ratio, goal, want):
    assert holds(ratio, goal) is want


def test_rows_printed_by_a_bench_make_the_table(capsys):
    print("a human line, ratio 9.9 (goal <= 1)")
    emit("async save / sync save (110 MB)", 0.27, "<= 0.05")
    emit("KV-cache decode speed-up (tiny)", 7.25, ">= 5")
    rows = parse(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["async save / sync save (110 MB)", "KV-cache decode speed-up (tiny)"]
    lines = table({"checkpoint": (rows[:1], ""), "rollout": (rows[1:], ""), "dpo_step": ([], "exit 1: Boom")})
    assert [line.split()[-1] for line in lines[1:]] == ["miss", "ok", "miss"]
    assert "0.270" in lines[1] and "<= 0.05" in lines[1] and "7.250" in lines[2] and "exit 1: Boom" in lines[3]


def test_every_bench_script_is_in_the_runner():
    import os

    from tests.helpers import REPO

    scripts = {f[:-3] for f in os.listdir(os.path.join(REPO, "bench")) if f.endswith(".py")}
    assert scripts - {"__main__", "rows"} == set(BENCHES)


def test_benches_share_the_runs_compilation_cache_unless_cold(monkeypatch, tmp_path):
    from bench.__main__ import shared_cache

    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("STACK_CACHE_DIR", str(tmp_path))
    with shared_cache(cold=False) as cache:
        assert cache == str(tmp_path / "jax")  # `python -m stack`'s: a rerun loads what a run compiled
    with shared_cache(cold=True) as cache:
        assert tmp_path.name not in cache and os.path.isdir(cache)
    assert not os.path.exists(cache)  # a cold cache is removed after the run
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
    with shared_cache(cold=False) as cache:
        assert cache == str(tmp_path / "mine")  # the user's own wins, as for `python -m stack`


def test_a_bench_process_output_is_kept_with_logs(monkeypatch, tmp_path):
    import bench.__main__ as runner

    (tmp_path / "fake.py").write_text(f"import sys\nsys.path.insert(0, {runner.HERE!r})\nfrom rows import emit\n"
                                      "print('steps 257 GFLOP/s')\nemit('a ratio', 0.5, '<= 1')\n"
                                      "print('a warning', file=sys.stderr)\n")
    monkeypatch.setattr(runner, "HERE", str(tmp_path))
    monkeypatch.setitem(runner.BENCHES, "fake", ([], [], None))
    (tmp_path / "logs").mkdir()
    rows, failure = runner.run("fake", [], str(tmp_path / "cache"), str(tmp_path / "logs"))
    assert failure == "" and [r["ratio"] for r in rows] == [0.5]
    log = (tmp_path / "logs" / "fake.log").read_text()
    assert "steps 257 GFLOP/s" in log and "a warning" in log  # the lines behind the row, stderr too


def test_markdown_formats_the_rows_as_a_table(capsys):
    """`python -m bench --markdown`: bench, measures, reading, goal, ok/miss; a failed bench is a miss row,
    a `|` in a name is escaped, the benches not run are named under the table."""
    from bench.__main__ import markdown

    emit("async save / sync save (110 MB)", 0.0181, "<= 0.05")
    emit("decode | speed-up (tiny)", 4.9, ">= 5")
    rows = parse(capsys.readouterr().out)
    lines = markdown({"checkpoint": (rows[:1], ""), "rollout": (rows[1:], ""), "dpo_step": ([], "exit 1: Boom")},
                     ["tunix_dpo (needs tunix)"])
    assert lines[:2] == ["| bench | measures | reading | goal | ok/miss |", "|---|---|---|---|---|"]
    assert lines[2] == "| `checkpoint` | async save / sync save (110 MB) | 0.018 | <= 0.05 | ok |"
    assert lines[3] == "| `rollout` | decode \\| speed-up (tiny) | 4.900 | >= 5 | miss |"
    assert lines[4] == "| `dpo_step` | failed (exit 1: Boom) | | | miss |"
    assert lines[5:] == ["", "Not run: tunix_dpo (needs tunix)."]
    assert all(len(re.split(r"(?<!\\)\|", line)) == 7 for line in lines[:5])  # five cells each
    assert markdown({}) == lines[:2]


def test_the_markdown_option_prints_only_the_table_on_stdout(monkeypatch, capsys):
    import bench.__main__ as runner

    monkeypatch.setattr(runner, "BENCHES", {"fake": ([], [], None), "gone": ([], [], "no_such_module_here")})
    monkeypatch.setattr(runner, "run", lambda script, args, cache, logs: ([{"name": "a ratio", "ratio": 0.5,
                                                                            "goal": "<= 1"}], ""))
    monkeypatch.setattr("sys.argv", ["bench", "--markdown"])
    with pytest.raises(SystemExit) as exit_:
        runner.main()
    out, err = capsys.readouterr()
    assert exit_.value.code == 0 and "ran fake in" in err
    assert out.splitlines() == runner.markdown({"fake": ([{"name": "a ratio", "ratio": 0.5, "goal": "<= 1"}], "")},
                                               ["gone (needs no_such_module_here)"])


def test_the_bench_readme_table_is_in_the_markdown_format():
    """bench/README.md's table is `python -m bench --markdown`'s output between its markers: the same
    header, five cells a row, each verdict the goal's, every bench in a row or named as not run."""
    from bench.__main__ import markdown
    from tests.helpers import REPO

    text = open(os.path.join(REPO, "bench", "README.md")).read()
    block = re.search(r"<!-- bench table: python -m bench --markdown -->\n(.*?)<!-- end bench table -->", text, re.S)
    assert block, "bench/README.md lost its table markers"
    lines = block.group(1).strip().splitlines()
    assert lines[:2] == markdown({})
    table_rows = [line for line in lines[2:] if line.startswith("|")]
    assert table_rows
    for line in table_rows:
        bench, _, reading, goal, verdict = (c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1])
        assert bench.strip("`") in BENCHES, line
        assert verdict == ("ok" if reading and holds(float(reading), goal) else "miss"), line  # failed: no reading
    named = {line.split("`")[1] for line in table_rows} | set(re.findall(r"(\w+) \(needs", block.group(1)))
    assert named == set(BENCHES)


@pytest.mark.parametrize("case", ["unknown bench", "logs is a file", "logs not empty", "logs uncreatable"])
def test_bad_input_to_the_runner_is_one_paragraph_and_exit_2_before_any_bench(case, monkeypatch, tmp_path, capsys):
    """Issue 82 item 1: `python -m bench` as every stack command; no bench runs, nothing is overwritten."""
    import bench.__main__ as runner

    monkeypatch.setattr(runner, "run", lambda *a: pytest.fail("a bench ran"))
    (tmp_path / "file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "dpo_step.log").write_text("an earlier reading")
    argv, words = {
        "unknown bench": (["dpo_stepp"], "unknown bench dpo_stepp; the benches: step_overhead, dpo_step"),
        "logs is a file": (["--logs", str(tmp_path / "file")], "is a file; give a directory"),
        "logs not empty": (["--logs", str(tmp_path / "full")], "already exists and is not empty; pick a new"),
        "logs uncreatable": (["--logs", "/proc/bench-logs"], "cannot be created"),
    }[case]
    with pytest.raises(SystemExit) as exit_:
        runner.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1 and words in err, err
    assert (tmp_path / "full" / "dpo_step.log").read_text() == "an earlier reading"
