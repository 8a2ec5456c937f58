"""Multi-turn rollouts (the `env` group): the calculator environment by hand, the environments' worker
rules, the host loop's transcripts (model tokens in the loss mask, the environment's out of it), and
GRPO's loss and KL leaving out every environment token."""

import math

import numpy as np
import pytest

from stack.algorithms.grpo import GRPO
from stack.algorithms.transcripts import run_turns
from stack.data.tokenizers import ByteTokenizer
from stack.rewards.calculator import Calculator, evaluate
from stack.rewards.env_runner import EnvRunner
from stack.rewards.environment import Step
from tests.helpers import loss_of
from tests.unit.env_fns import Flaky, Greeter
from tests.unit.test_grpo import Scores

TOK = ByteTokenizer()
EOS = TOK.eos_id


def test_the_calculator_answers_a_call_and_rewards_the_last_turn_only():
    env = Calculator()
    env.reset({"prompt": "16+36=", "answer": "52"})
    assert env.step("calc(16+36)") == Step(" = 52\n")
    assert env.step("calc(2*(3+4)-1)") == Step(" = 13\n")
    assert env.step("calc(__import__('os'))") == Step(" = error\n")
    assert env.step("52") == Step(reward=1.0, done=True)
    assert env.step("calc(16+36) = 52\n51") == Step(reward=0.0, done=True)  # no call at the end: an answer
    assert evaluate("-3 * 4") == -12
    for bad in ("2/3", "2**999", "x", "1.5+1"):
        with pytest.raises(ValueError):
            evaluate(bad)


def test_a_failing_environment_ends_its_trajectory_and_the_run_goes_on():
    runner = EnvRunner("flaky", Flaky, max_turns=2, weight=1.0, timeout=5.0)
    try:
        runner.reset([{}] * 3)
        with pytest.warns(RuntimeWarning, match="environment 'flaky' failed"):
            steps = runner.step([0, 1, 2], ["boom", "bad", "ok"])
        assert "ValueError: the tool crashed" in str(steps[0]) and "not a Step" in str(steps[1])
        assert steps[2] == Step("", 1.0, True)
        runner.timeout = 0.5
        runner.reset([{}])
        assert "no answer within env.timeout=0.5s" in str(runner.step([0], ["slow"])[0])
        runner.reset([{}])  # a new worker
        assert runner.step([0], ["ok"]) == [Step("", 1.0, True)]
    finally:
        runner.close()


def scripted(turns: dict[int, list[str]], width: int, seen: list):
    """A stand-in for the turn program: row r's text in turn t is turns[t][r] (EOS where it ends with
    '$'), its log-probs -(t + 1); `seen` keeps the contexts it was given."""

    def turn(ids, mask, t):
        seen.append((ids.copy(), mask.copy()))
        tokens, out_mask = np.zeros((len(ids), width), np.int32), np.zeros((len(ids), width), np.int32)
        for r, text in enumerate(turns[t]):
            row = TOK.encode(text.rstrip("$")) + ([EOS] if text.endswith("$") else [])
            tokens[r, :len(row)], out_mask[r, :len(row)] = row, 1
        return {"tokens": tokens, "mask": out_mask, "logps": np.full((len(ids), width), -(t + 1.0), np.float32)}

    return turn


def test_transcripts_hold_the_model_turns_in_the_loss_mask_and_the_tool_output_out_of_it():
    """Row 0 calls the tool then copies its answer; row 1 answers at once (wrong); row 2 runs out of budget."""
    width, env = 24, EnvRunner("calculator", Calculator, max_turns=3, weight=1.0, timeout=30.0)
    prompts = ["16+36=", "16+36=", "9+9="]
    ids = np.zeros((3, 8), np.int32)
    mask = np.zeros((3, 8), np.int32)
    for r, p in enumerate(prompts):
        ids[r, 8 - len(p):], mask[r, 8 - len(p):] = TOK.encode(p), 1
    turns = {0: ["calc(16+36)", "51$", "x" * width], 1: ["52$", "", ""]}
    seen = []
    try:
        out = run_turns(scripted(turns, width, seen), env, TOK, ids, mask,
                        [{"answer": "52"}, {"answer": "52"}, {"answer": "18"}], width, 0, (EOS,))
    finally:
        env.close()
    text = "calc(16+36) = 52\n52"
    assert TOK.decode(out["completion"][0].tolist()) == text and out["completion"][0, len(text)] == EOS
    model = np.zeros(width, np.int32)
    model[:11], model[17:20] = 1, 1  # "calc(16+36)" and "52" + EOS; " = 52\n" is the tool's
    np.testing.assert_array_equal(out["completion_mask"][0], model)
    np.testing.assert_array_equal(out["env_mask"][0], np.r_[np.zeros(11), np.ones(6), np.zeros(7)])
    np.testing.assert_array_equal(out["sampler_logps"][0], np.where(model, np.r_[[-1.0] * 17, [-2.0] * 7], 0))
    np.testing.assert_array_equal(out["env_reward"], [1.0, 0.0, 0.0])  # a cut turn is stepped (and ends) too
    np.testing.assert_array_equal(out["env_turns"], [2, 1, 1])
    np.testing.assert_array_equal(out["env_calls"], [1, 0, 0])
    np.testing.assert_array_equal(out["truncated"], [False, False, True])
    assert out["completion_mask"][2].sum() == width and out["env_mask"][2].sum() == 0  # cut at the budget
    assert len(seen) == 2  # turn 2 never runs: every trajectory ended
    ctx_ids, ctx_mask = seen[1]
    context = TOK.decode(ctx_ids[0][ctx_mask[0] > 0].tolist())
    assert context == "16+36=calc(16+36) = 52\n" and ctx_mask[0, :-len(context)].sum() == 0  # left-padded


def test_an_environment_may_write_the_first_prompt():
    env = EnvRunner("greeter", Greeter, max_turns=1, weight=1.0, timeout=30.0)
    ids, mask = np.zeros((1, 8), np.int32), np.zeros((1, 8), np.int32)
    try:
        out = run_turns(scripted({0: ["ok$"]}, 4, []), env, TOK, ids, mask, [{"answer": "7"}], 4, 0, (EOS,))
    finally:
        env.close()
    assert TOK.decode(out["prompt_ids"][0][out["prompt_mask"][0] > 0].tolist()) == "hi 7:"
    assert out["env_reward"][0] == 1.0


def test_the_loss_and_the_kl_leave_out_every_environment_token():
    """Old and reference log-probs far off at the environment's tokens change nothing: not the loss, the
    KL, the entropy or the clipping, and the dapo denominator counts the model's tokens only."""
    logp = np.array([[-1.0, -0.5, -2.0, -0.3], [-0.2, -0.3, -0.4, -0.6]], np.float32)
    env_mask = np.array([[0, 1, 1, 0], [0, 0, 1, 0]], np.int32)
    batch = {"prompt_ids": np.ones((2, 2), np.int32), "prompt_mask": np.ones((2, 2), np.int32),
             "completion": np.ones((2, 4), np.int32), "completion_mask": 1 - env_mask, "env_mask": env_mask,
             "old_logps": logp - 0.1, "ref_logps": logp + 0.05, "advantages": np.array([1.0, -2.0], np.float32)}
    far = {**batch, "old_logps": np.where(env_mask, 30.0, batch["old_logps"]),
           "ref_logps": np.where(env_mask, -30.0, batch["ref_logps"])}
    grpo = GRPO(beta=0.04, num_iterations=2, max_new_tokens=4)
    (loss, m), (loss_far, m_far) = loss_of(grpo, Scores(logp), batch), loss_of(grpo, Scores(logp), far)
    assert float(loss) == float(loss_far) and all(float(m[k]) == float(m_far[k]) for k in m)
    # by hand (dapo): 5 model tokens, each ratio e^0.1 (unclipped for A = 1 below 1.2; for A = -2 the min
    # takes the unclipped one), each KL k3 of log(ref / pi) = 0.05 times the ratio (bias correction)
    r, k3 = math.exp(0.1), math.exp(0.05) - 0.05 - 1
    want = (2 * -r * 1.0 + 3 * r * 2.0 + 5 * 0.04 * k3 * r) / 5
    assert float(loss) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("engine", ["static", "paged"])
def test_a_multi_turn_grpo_run_samples_what_the_trainer_scores(tmp_path, engine):
    """The turns' contexts (prompt, transcript, left-padded) give the sampler the log-probs the training
    forward computes over the packed transcript: step 1's mismatch is float noise with up to 3 model turns
    per trajectory, and the environment's rewards (Chatter: each turn's length) are the reward."""
    from stack.engine.trainer import train
    from stack.run.build import build
    from tests.helpers import captured, make_cfg
    from tests.unit.test_grpo import GRPO_RUN

    cfg = make_cfg(GRPO_RUN + ["trainer.steps=2", "algorithm.num_iterations=2", "algorithm.max_new_tokens=24",
                               "allow_targets=[tests.unit.env_fns]", "env.environment=tests.unit.env_fns.Chatter",
                               "env.max_turns=3", "reward.functions=[]", f"rollout.engine={engine}",
                               f"run_dir={tmp_path}"])
    exp, cap = captured(build(cfg, str(tmp_path)))
    try:
        summary = train(exp)
    finally:
        exp.env.close()
    first = next(r for r in cap.rows if r["step"] == 1)
    assert first["train/logprob_mismatch"] < 1e-4 and first["train/clip_ratio/region_mean"] == 0.0
    assert 1.2 < first["train/env/turns"] <= 3 and first["train/env/tool_call_rate"] > 0.25  # 1.69, 0.56 here
    assert first["train/env/errors"] == 0 and first["train/reward"] == first["train/rewards/env/mean"] > 0
    assert first["train/completions/mean_length"] < 24 and "eval/env/turns" in summary.eval


@pytest.mark.parametrize("overrides, match", [
    (["env=calculator"], "rolls out multi-turn trajectories for algorithm=grpo; algorithm='sft' does not"),
    (["+recipe=llama_ppo", "env=calculator"], "algorithm='ppo' does not"),
    (["+recipe=llama_grpo", "env.environment=abacus"], "Unknown environment 'abacus' for 'env.environment'"),
    (["+recipe=llama_grpo", "env.environment=os.system"], r"add 'allow_targets=\[os\]'"),
    (["+recipe=llama_grpo", "env=calculator", "env.max_turns=0"], "'env.max_turns'=0 must be a positive integer"),
    (["+recipe=llama_grpo", "env=calculator", "eval.num_samples=4"], "Drop eval.num_samples, or use env=none"),
])
def test_a_bad_env_is_refused_naming_the_key(overrides, match):
    from stack.config.validate import validate
    from stack.errors import ConfigError
    from tests.helpers import make_cfg

    with pytest.raises(ConfigError, match=match):
        validate(make_cfg(overrides))
