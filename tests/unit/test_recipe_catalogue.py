"""stack.tools.recipes: the catalogue lines, the comparison of a run with its expectation (readable
rows, drift, config and version changes) and the recorder's refusal of a dirty tree."""

import copy
import re
import subprocess

import pytest

from stack.config.schema import recipe_files
from stack.errors import ConfigError
from stack.tools import expectations, recipes

EXPECTED = {"recorded_with": {"jax": "0.10.2", "machine": "Linux x86_64, 2 cpus"}, "overrides": expectations.SHRINK,
            "tolerance": {"train/loss": 0.02}, "mean_tolerance": 0.005,
            "steps": {"train/loss": {"5": 4.0, "10": 3.0, "15": 2.0, "20": 1.0}},
            "config": {"model.d_model": 64, "optimizer.lr": 0.003}}


def run_like(scale: float = 1.0, **changes) -> dict:
    got = copy.deepcopy(EXPECTED)
    got["steps"]["train/loss"] = {s: v * scale for s, v in got["steps"]["train/loss"].items()}
    for key, value in changes.items():
        got[key] = value
    return got


def test_a_run_within_tolerance_passes():
    assert expectations.compare(EXPECTED, run_like(1.004)) == []


def test_a_step_out_of_tolerance_is_a_readable_row_naming_versions():
    got = run_like(recorded_with={"jax": "0.12.0", "machine": "Linux x86_64, 2 cpus"})
    got["steps"]["train/loss"]["15"] = 2.1
    problems = expectations.compare(EXPECTED, got)
    assert problems[0].split() == ["step", "metric", "expected", "got", "rtol"]
    assert problems[1].split() == ["15", "train/loss", "2", "2.1", "0.02"]
    assert "mean relative residual +0.0125" in problems[2]
    assert "recorded with other versions" in problems[-1] and "0.10.2 -> 0.12.0" in problems[-1]


def test_a_small_systematic_drift_fails_though_every_step_is_within_tolerance():
    problems = expectations.compare(EXPECTED, run_like(1.015))
    assert len(problems) == 1 and "mean relative residual +0.0150 over 4 steps" in problems[0]


def test_a_changed_default_and_other_overrides_are_named():
    got = run_like(config={"model.d_model": 128, "optimizer.lr": 0.003, "trainer.steps": 20})
    problems = expectations.compare(EXPECTED, got)
    assert problems == ["the resolved config changed (re-record if intended):", "  model.d_model: 64 -> 128",
                        "  trainer.steps: '<absent>' -> 20"]
    new_options = {"data.new_flag": False, "data.new_limit": None, "data.new_mode": "on"}  # added since recording
    problems = expectations.compare(
        EXPECTED, run_like(config={"model.d_model": 64, "optimizer.lr": 0.003, **new_options}))
    assert problems == ["the resolved config changed (re-record if intended):", "  data.new_mode: '<absent>' -> 'on'"]
    assert "other overrides" in expectations.compare({**EXPECTED, "overrides": ["trainer.steps=5"]}, got)[0]


def test_catalogue_lists_every_recipe_with_its_header_fields():
    found, errors = recipes.catalogue()
    rows = {r[0]: r for r in found}
    assert set(rows) == set(recipe_files()) and errors == []
    assert rows["llama_dpo"][1:] == ("dpo", "llama_tiny", "cpu", "~40 s")
    assert rows["llama_rm"][1:4] == ("rm", "llama_small", "cpu")
    assert "groups:   model=llama_tiny" in recipes.show("llama_dpo")


def test_record_refuses_a_dirty_tree(tmp_path, monkeypatch):
    (tmp_path / "expected").mkdir()
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "untracked.txt").write_text("x")
    monkeypatch.setattr(recipes, "expected_dir", lambda: str(tmp_path / "expected"))
    with pytest.raises(ConfigError, match="refusing to record on a dirty tree .*; changed: untracked.txt"):
        recipes.record(["llama_sft"])


def one_paragraph(argv: list[str], capsys) -> tuple[str, str]:
    """(stdout, the error paragraph) of `python -m stack.tools.recipes ARGV` that exits 2."""
    with pytest.raises(SystemExit) as info:
        recipes.main(argv)
    out, err = capsys.readouterr()
    assert info.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    return out, err


def test_an_unknown_recipe_is_one_line_before_anything_is_recorded(capsys):
    """`record NAME` with a misspelt NAME was Hydra's MissingConfigException (a traceback)."""
    for argv in (["record", "llama_sft", "llama_sfx"], ["llama_sfx"]):
        assert re.match("error: no recipe 'llama_sfx'; recipes: .*llama_sft", one_paragraph(argv, capsys)[1])


def test_a_recipe_that_does_not_compose_and_a_damaged_expectation_are_named(tmp_path, monkeypatch, capsys):
    """Issue 82 item 1: the catalogue lists the recipes that compose, then names the one that does not;
    a recipe's expectation that is not JSON is named with the way to restore it."""
    shipped = recipe_files()
    monkeypatch.setattr(recipes, "recipe_files", lambda: {**shipped, "mine": "# @package _global_\nmodel: nope\n"})
    out, err = one_paragraph([], capsys)
    assert "llama_sft" in out and "mine" not in out
    assert err.startswith("error: The recipe 'mine' (recipes/mine.yaml) cannot be composed (")
    monkeypatch.setattr(recipes, "expected_dir", lambda: str(tmp_path))
    bad = tmp_path / "llama_sft.json"
    bad.write_text('{"steps": {"train/loss"')  # cut short
    err = one_paragraph(["llama_sft"], capsys)[1]
    assert err.startswith(f"error: {str(bad)!r} cannot be read as a recipe's expectations (JSONDecodeError") and \
        "record llama_sft" in err


REPORT = """mode=compile: model=llama3_8b on hardware=tpu_v5e (v5e:2x4, 8 device(s), 1 host(s)), mesh=fsdp
per device total: 15.13 GiB of 16.00 GiB HBM (95%)
FLOPs per device per step: 4.373e+13 (XLA), 4.693e+13 (model formula); predicted step time ...
fits: 15.13 GiB <= 16.00 GiB
"""


def test_a_compile_report_is_read_and_compared_with_its_tolerance():
    from stack.tools.recipe_compile import TOLERANCE, compare_compile, parse_report

    got = parse_report(REPORT)
    assert got == {"per_device_gib": 15.13, "flops_per_device": 4.373e13, "fits": True}
    assert not parse_report(REPORT.replace("fits: 15.13", "does not fit: 15.13"))["fits"]
    expected = {"compile": got, "tolerance": TOLERANCE, "config": {"a": 1}, "recorded_with": {"jax": "0.10.2"}}
    near = {**expected, "compile": {**got, "per_device_gib": 15.13 * 1.019}}
    assert compare_compile(expected, near) == []
    far = {**expected, "compile": {**got, "per_device_gib": 15.6, "fits": False}, "recorded_with": {"jax": "0.11"}}
    problems = compare_compile(expected, far)
    assert problems[1].split() == ["per_device_gib", "15.13", "15.6", "0.02"]
    assert problems[2] == "fits: expected True, got False" and "0.10.2 -> 0.11" in problems[-1]
    with pytest.raises(RuntimeError, match="no per-device total"):
        parse_report("Error: libtpu not found")


def test_real_size_recipes_are_told_from_small_ones():
    from stack.tools.recipe_compile import is_real_size

    sizes = {name: is_real_size(expectations.recipe_config(name)) for name in ("llama_sft", "llama3_8b_sft_tpu_v5e")}
    assert not sizes["llama_sft"] and sizes["llama3_8b_sft_tpu_v5e"]
