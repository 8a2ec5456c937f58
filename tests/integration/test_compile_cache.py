"""The persistent compilation cache: a rerun of the same command compiles nothing new (every
program is a cache hit: no entry is added) and trains to the same losses."""

import pytest

from tests.helpers import read_metrics, run_cli

RUN = ["+recipe=llama_sft", "checkpoint=none", "trainer.steps=3", "trainer.log_every=1", "trainer.eval_batches=1"]


@pytest.mark.slow  # ~22 s of three cold compiles: CI's slow step runs it
def test_a_rerun_loads_every_program_from_the_cache(tmp_path):
    cache = tmp_path / "jax_cache"
    env = {"JAX_COMPILATION_CACHE_DIR": ""}  # the run's own setting, not the environment's
    first = run_cli(RUN + [f"trainer.compilation_cache={cache}", f"run_dir={tmp_path}/a"], str(tmp_path), env)
    assert first.returncode == 0, first.stderr
    entries = sorted(p.name for p in cache.iterdir())
    assert len(entries) >= 3  # at least the collect, update and eval programs
    second = run_cli(RUN + [f"trainer.compilation_cache={cache}", f"run_dir={tmp_path}/b"], str(tmp_path), env)
    assert second.returncode == 0, second.stderr
    assert sorted(p.name for p in cache.iterdir()) == entries  # all hits: nothing compiled anew
    math = lambda rows: [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]  # noqa: E731
    assert math(read_metrics(tmp_path / "a")) == math(read_metrics(tmp_path / "b"))
    off = run_cli(RUN + ["trainer.compilation_cache=off", f"run_dir={tmp_path}/c"], str(tmp_path), env)
    assert off.returncode == 0 and sorted(p.name for p in cache.iterdir()) == entries
