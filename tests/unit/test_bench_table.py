"""`python -m bench`'s table: the rows benches print are read back, judged against their goals
(bounds included or not as written), and every line ends with ok or miss."""

import os

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

    from tests.conftest import REPO

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
