"""A Hugging Face reward model as `reward.init_from=hf:DIR` (what TRL's RewardTrainer saves: a
LlamaForSequenceClassification with one label): it scores as transformers scores it, PPO and GRPO
train with it, and a directory that is not such a model is refused before the run starts."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from stack.config.validate import validate
from stack.engine.trainer import train
from stack.errors import ConfigError
from stack.rewards.model import ModelReward, score_texts
from stack.run.build import build
from tests.helpers import QUICK, make_cfg, read_metrics

transformers = pytest.importorskip("transformers", reason="the reference reward model is a transformers model")
torch = pytest.importorskip("torch", reason="the reference reward model is a transformers model")


def save_reward_model(path, vocab_size: int = 384, labels: int = 1, causal: bool = False):
    """A random Llama reward model of its own shapes (not the policy's), saved as transformers does."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      rms_norm_eps=1e-5, num_labels=labels, pad_token_id=0)
    cls = transformers.LlamaForCausalLM if causal else transformers.LlamaForSequenceClassification
    model = cls(config).eval()
    if not causal:
        torch.nn.init.normal_(model.score.weight)  # scores far from 0: a wrong trunk or head shows
    model.save_pretrained(str(path))
    return model


def test_scores_equal_transformers_at_the_last_real_token(tmp_path):
    hf = save_reward_model(tmp_path)
    scorer = ModelReward(f"hf:{tmp_path}").load(policy_cfg=make_cfg([]).model)
    ids = np.array([[1, 50, 60, 70, 2, 0, 0], [1, 80, 81, 82, 83, 84, 2]], np.int64)  # right-padded, pad id 0
    ours = scorer(jnp.asarray(ids, jnp.int32), jnp.asarray((ids > 0).astype(np.int32)))
    with torch.no_grad():
        theirs = hf(torch.from_numpy(ids)).logits[:, 0].numpy()
    assert np.abs(theirs).min() > 0.1
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-5)


def test_score_texts_of_the_dir_equal_transformers_on_its_byte_encoding(tmp_path):
    """`stack.tools.generate DIR --score` (score_texts of `hf:DIR`): a dir without tokenizer.json is read
    with the byte tokenizer (BOS 1, EOS 2, byte + 3), as transformers scores those ids."""
    hf = save_reward_model(tmp_path)
    pairs = [("copy abc=", "abc"), ("12+7=", "19"), ("copy abc=", "abd")]
    ours = score_texts(f"hf:{tmp_path}", [p for p, _ in pairs], [c for _, c in pairs])
    with torch.no_grad():
        theirs = [hf(torch.tensor([[1, *(b + 3 for b in (p + c).encode()), 2]])).logits[0, 0].item() for p, c in pairs]
    assert len(set(np.round(theirs, 3))) == 3
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_ppo_trains_scored_by_it(tmp_path):
    save_reward_model(tmp_path / "rm")
    (tmp_path / "run").mkdir()
    cfg = make_cfg(["algorithm=ppo", "data=jsonl_prompts", *QUICK, "algorithm.max_new_tokens=4",
                    "algorithm.num_ppo_epochs=1", "algorithm.num_mini_batches=1", "trainer.steps=1",
                    "checkpoint=none", "reward=model", f"reward.init_from=hf:{tmp_path / 'rm'}",
                    f"run_dir={tmp_path / 'run'}"])
    validate(cfg)
    train(build(cfg, str(tmp_path / "run")))
    row = next(r for r in read_metrics(tmp_path / "run") if "train/objective/scores" in r)
    assert math.isfinite(row["train/objective/scores"]) and row["train/objective/scores"] != 0.0


@pytest.mark.parametrize("functions", [[], ["length"]])
def test_grpo_trains_scored_by_it(functions, tmp_path):
    """TRL GRPOTrainer's reward_funcs with a reward model: GRPO's groups ranked by its scores, alone
    or weighted beside a rule function (the model's weight last)."""
    save_reward_model(tmp_path / "rm")
    (tmp_path / "run").mkdir()
    weights = [0.5, 2.0] if functions else [2.0]
    cfg = make_cfg(["algorithm=grpo", "data=jsonl_prompts", *QUICK, "algorithm.max_new_tokens=4",
                    "algorithm.num_generations=4", "trainer.steps=1", "trainer.eval_every=1", "checkpoint=none",
                    "reward=model", f"reward.init_from=hf:{tmp_path / 'rm'}", f"reward.functions={functions}",
                    f"reward.weights={weights}", f"run_dir={tmp_path / 'run'}"])
    validate(cfg)
    exp = build(cfg, str(tmp_path / "run"))
    train(exp)
    assert (exp.algorithm.score is None) == (not functions)  # a reward model alone: nothing scored on the host
    rows = read_metrics(tmp_path / "run")
    row = next(r for r in rows if "train/reward" in r)
    assert math.isfinite(row["train/reward"]) and row["train/reward_std"] > 0.01  # continuous scores differ
    rules = 0.5 * row["train/rewards/length/mean"] if functions else 0.0
    assert row["train/reward"] == pytest.approx(2.0 * row["train/rewards/reward_model/mean"] + rules, rel=1e-5)
    assert row["train/frac_reward_zero_std"] == 0.0
    assert math.isfinite(next(r for r in rows if "eval/reward" in r)["eval/reward"])


@pytest.mark.parametrize("kind,match", [
    ("causal", r"architectures=\['LlamaForCausalLM'\]; stack reads a one-label sequence classifier "
               r"\(reward model\) of model_type llama"),
    ("labels", r"config.json has 2 labels \(id2label\); a reward model scores with one"),
    ("vocab", r"has vocab_size=512 and the policy model.vocab_size=384: .* must share its tokenizer"),
])
def test_a_directory_that_is_not_such_a_model_is_refused_up_front(kind, match, tmp_path):
    save_reward_model(tmp_path, vocab_size=512 if kind == "vocab" else 384, labels=2 if kind == "labels" else 1,
                      causal=kind == "causal")
    cfg = make_cfg(["algorithm=ppo", "data=jsonl_prompts", "reward=model", f"reward.init_from=hf:{tmp_path}"])
    with pytest.raises(ConfigError, match=rf"^'reward.init_from'='hf:{tmp_path}'.*{match}"):
        validate(cfg)
