"""The reward runner with real worker processes: failures and timeouts give NaN, never hang,
warn once and are counted; user functions need an explicit allow-list entry."""

import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from stack.algorithms.onpolicy import reward_inputs, score_on_host
from stack.data.tokenizers import ByteTokenizer
from stack.errors import ConfigError
from stack.rewards.functions import RULES
from stack.rewards.group import make_rewards, metric_name, resolve
from stack.rewards.runner import RewardRunner
from tests.helpers import REPO, make_cfg
from tests.unit import reward_fns


def test_failures_and_timeouts_score_nan_and_the_run_goes_on():
    runner = RewardRunner([("ok", reward_fns.constant), ("boom", reward_fns.raises), ("slow", reward_fns.sleeps),
                           ("none", reward_fns.some_none), ("short", reward_fns.wrong_length)], [1.0] * 5, timeout=2.0)
    try:
        start = time.monotonic()
        with pytest.warns(RuntimeWarning) as caught:
            out = runner(["p"] * 3, ["c"] * 3, {"answer": ["1", "?", "3"]})
        assert time.monotonic() - start < 30  # the sleeping function was cut off, not waited for
        assert sorted(str(w.message).split("'")[1] for w in caught) == ["boom", "short", "slow"]
        assert "RuntimeError: the grader is broken" in str(next(w for w in caught if "boom" in str(w.message)).message)
        np.testing.assert_array_equal(out[:, 0], [1.0, 1.0, 1.0])
        assert np.isnan(out[:, 1]).all() and np.isnan(out[:, 2]).all() and np.isnan(out[:, 4]).all()
        np.testing.assert_array_equal(np.isnan(out[:, 3]), [False, True, False])  # None -> NaN, never 0
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # warned once per function: silent the second time
            again = runner(["p"], ["c"], {"answer": ["1"]})
        assert again[0, 0] == 1.0 and np.isnan(again[0, 2])  # a fresh worker replaced the timed-out one
    finally:
        runner.close()


def test_values_that_are_not_finite_numbers_score_nan_with_one_warning_naming_them():
    """A string, inf and -inf are treated as a raise would be (the run goes on); a numpy number counts."""
    runner = RewardRunner([("odd", reward_fns.not_numbers)], [1.0], timeout=30.0)
    try:
        with pytest.warns(RuntimeWarning, match=r"'odd' failed \(3 of 4 values are not finite numbers: "
                                                r"-inf, inf, str\)") as caught:
            out = runner(["p"] * 4, ["c"] * 4, {"answer": ["1"] * 4})
        assert len(caught) == 1
        np.testing.assert_array_equal(np.isnan(out[:, 0]), [True, True, True, False])
        assert out[3, 0] == 0.25
    finally:
        runner.close()


def test_a_function_that_kills_its_worker_scores_nan_and_its_worker_is_replaced():
    runner = RewardRunner([("ok", reward_fns.constant), ("crash", reward_fns.kills_its_process)], [1.0, 1.0], 30.0)
    try:
        with pytest.warns(RuntimeWarning, match=r"'crash' failed \(its worker process died, exit code 3\)"):
            out = runner(["p"] * 2, ["c"] * 2, {})
        np.testing.assert_array_equal(out[:, 0], [1.0, 1.0])
        assert np.isnan(out[:, 1]).all()
        assert np.isnan(runner(["p"], ["c"], {})[0, 1])  # a fresh worker, the same crash: still NaN, no hang
    finally:
        runner.close()


UNGUARDED = """from stack.rewards.runner import RewardRunner
from tests.unit import reward_fns
RewardRunner([("ok", reward_fns.constant)], [1.0], 60.0)(["p"], ["c"], {})
"""


def test_a_script_without_the_main_guard_gets_a_clear_error(tmp_path):
    """The spawned worker imports the unguarded script, which spawns again while bootstrapping and dies."""
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED)
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": REPO})  # the script imports tests.unit.reward_fns
    assert res.returncode != 0
    assert "RunFailed: the worker process of reward function 'ok' exited with code 1 before it started" in res.stderr
    assert 'under `if __name__ == "__main__":`' in res.stderr


def test_functions_get_what_trl_hands_them_by_keyword():
    """TRL GRPOTrainer's call: keywords, every record column (None where a record lacks it) and, of a
    conversational prompt, its messages and the completion as an assistant message."""
    chat = [{"role": "user", "content": "2+2="}]
    host = {"answer": ["2", "4"], "fields": ['{"solution": "2", "level": 1}', json.dumps({"prompt": chat})]}
    prompts, completions, columns = reward_inputs(["1+1=", "user: 2+2=\nassistant: "], ["2", "five"], host)
    assert columns == {"answer": ["2", "4"], "level": [1, None], "solution": ["2", None]}  # None: as a HF dataset
    assert prompts == ["1+1=", chat] and completions == ["2", [{"role": "assistant", "content": "five"}]]
    runner = RewardRunner([("trl", reward_fns.trl_style), ("solution", reward_fns.by_solution),
                           ("accuracy", RULES["accuracy"])], [1.0] * 3, 10.0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no function fails
            out = runner(prompts, completions, columns)
        np.testing.assert_array_equal(out[:, 0], [-2.0, -1.0])  # -|3 - len(text)|, of a message's content too
        np.testing.assert_array_equal(out[:, 1], [1.0, np.nan])
        np.testing.assert_array_equal(out[:, 2], [1.0, 0.0])  # the built-in rules read either form
    finally:
        runner.close()


def test_user_functions_need_the_allow_list():
    with pytest.raises(ConfigError, match=r"allow_targets=\[tests.unit.reward_fns\]"):
        resolve("tests.unit.reward_fns.constant", ())
    assert resolve("tests.unit.reward_fns.constant", ("tests",)) is reward_fns.constant
    with pytest.raises(ConfigError, match="names a module, not a class or function"):
        resolve("tests.unit.reward_fns.time", ("tests",))  # a module reached through the allowed one
    with pytest.raises(ConfigError, match="not a class or function"):
        resolve("tests.unit.reward_fns.time.sleep", ("tests",))  # and a builtin through it
    with pytest.raises(ConfigError, match="Did you mean accuracy"):
        resolve("acuracy", ())


def test_score_on_host_decodes_each_completion_of_each_prompt_and_passes_its_ids():
    tok = ByteTokenizer()
    prompt, a, b = tok.encode("1+1="), tok.encode("2"), tok.encode("11")
    completion = np.array([[a + [tok.eos_id, 0, 0, 0], b + [0, 0, 0]]], np.int32)  # G = 2 of one prompt; row 1 clipped
    xp = {"prompt_ids": np.array([[prompt, prompt]], np.int32), "prompt_mask": np.ones((1, 2, 4), np.int32),
          "completion": completion, "completion_mask": (np.arange(5) < np.array([[2, 2]])[..., None]).astype(np.int32)}
    host = {"answer": np.array([["2"]]), "fields": np.array([['{"solution": "2"}']])}
    runner = RewardRunner([("echo", reward_fns.echo)], [1.0], 10.0)
    try:
        out = score_on_host(tok, runner, xp, host, None)
    finally:
        runner.close()
    # ids: [2, EOS] and [1, 1] (EOS kept in the ids, as TRL); text "2" and "11"; the record's solution
    np.testing.assert_array_equal(out[..., 0], [[2 + 10 * 1 + 100 + 4000, 2 + 10 * 2 + 100 + 4000]])


def test_a_user_function_is_logged_by_its_name_unless_two_share_it():
    """TRL logs rewards/<function name>/mean; a name two listed functions share keeps its import path."""
    runner = make_rewards(make_cfg(["reward.functions=[tests.unit.reward_fns.constant,accuracy]"]).reward, ("tests",))
    try:
        assert runner.names == ["constant", "accuracy"]
    finally:
        runner.close()
    assert metric_name("a.b.f", ["a.b.f", "c.f", "g"]) == "a.b.f" and metric_name("g", ["a.b.f", "c.f", "g"]) == "g"


def test_the_reward_group_builds_weighted_named_functions():
    cfg = make_cfg(["reward.functions=[accuracy,format]", "reward.weights=[1.0,0.2]"])
    runner = make_rewards(cfg.reward, ())
    try:
        assert runner.names == ["accuracy", "format"] and runner.weights.tolist() == pytest.approx([1.0, 0.2])
        out = runner(["1+1="] * 2, ["2", "3 apples"], {"answer": ["2", "2"]})
        np.testing.assert_array_equal(out, [[1.0, 1.0], [0.0, 0.0]])
    finally:
        runner.close()


def test_the_schema_names_every_built_in_rule():
    """Validation checks `reward.functions` against RewardConfig.rules (no jax, no workers); the
    functions themselves are RULES."""
    from stack.config.schema.reward import RewardConfig

    assert sorted(RULES) == sorted(RewardConfig.rules)
