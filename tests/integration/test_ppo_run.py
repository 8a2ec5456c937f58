"""PPO and reward models through the CLI: a kill -9 during PPO resumes exactly (value model,
adaptive KL coefficient and RNG in the checkpoint); a reward model trained by `algorithm=rm`
scores PPO's completions on device exactly as `score_texts` scores their text."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stack.algorithms.onpolicy import model_scores
from stack.engine.step import split_models
from stack.rewards.model import score_texts
from stack.run.build import build
from tests.helpers import make_cfg, read_metrics, run_cli
from tests.integration.test_resume import kill_at_step_and_rerun

PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in zip(range(20), range(3, 23), strict=True)]


def args(tmp_path, run_dir, *extra):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return ["data=jsonl_prompts", f"data.path={path}", f"data.eval_path={path}", "data.batch_size=8",
            "algorithm=ppo", "algorithm.max_new_tokens=4", "algorithm.num_ppo_epochs=2", "algorithm.adaptive_kl=true",
            "algorithm.target_kl=0.01", "algorithm.horizon=100", "trainer.steps=12", "trainer.log_every=1",
            "trainer.eval_every=0", "trainer.eval_batches=1", "checkpoint=local", "checkpoint.every=2",
            "logger=jsonl", f"run_dir={run_dir}", *extra]


def per_step(run_dir) -> dict[int, tuple[float, float, float]]:
    return {r["step"]: (r["train/loss"], r["train/kl_coef"], r["train/reward"])
            for r in read_metrics(run_dir) if "train/loss" in r}


@pytest.mark.slow  # main tier: a faster sibling covers it; CI runs the slow tier
def test_kill_9_during_ppo_resumes_exactly(tmp_path):
    reference = tmp_path / "reference"
    res = run_cli(args(tmp_path, reference), cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    want = per_step(reference)
    assert sorted(want) == list(range(1, 13))
    coefs = [want[s][1] for s in (1, 3, 5)]  # one per round of 2 steps, moved by the controller
    assert coefs[0] == pytest.approx(0.05) and coefs[0] != coefs[1] != coefs[2]
    # TRL's eps: 8 prompts, one completion each, per round of 2 optimizer steps = 4 episodes a step
    logged = [r for r in read_metrics(reference) if "eps" in r]
    assert len(logged) == 11 and all(r["eps"] * r["perf/step_seconds"] == pytest.approx(4.0) for r in logged)

    run_dir = tmp_path / "run"
    kill_at_step_and_rerun(args(tmp_path, run_dir), run_dir, 7, str(tmp_path), last=12)
    assert per_step(run_dir) == want  # exactly, step by step
    export_loads_with_its_value_head(run_dir, tmp_path / "hf")


def export_loads_with_its_value_head(run_dir, out) -> None:
    """`stack.tools.hf export` of a PPO policy: transformers loads it; the value head lies beside it."""
    transformers = pytest.importorskip("transformers", reason="the export check needs transformers")
    from safetensors.numpy import load_file

    res = subprocess.run([sys.executable, "-m", "stack.tools.hf", "export", str(run_dir / "checkpoints"),
                          "--out", str(out)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    transformers.LlamaForCausalLM.from_pretrained(str(out))
    assert load_file(str(out / "value_head.safetensors"))["score.weight"].shape == (1, make_cfg([]).model.d_model)


def test_reward_model_scores_ppo_completions_as_it_scores_text(tmp_path, capsys):
    rm_dir = tmp_path / "rm"
    res = run_cli(["algorithm=rm", "data=jsonl_prefs", "data.batch_size=8", "trainer.steps=3", "trainer.eval_every=0",
                   "trainer.eval_batches=1", "checkpoint=local", "logger=jsonl", f"run_dir={rm_dir}"],
                  cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    rm = str(rm_dir / "checkpoints")
    cfg = make_cfg(args(tmp_path, tmp_path / "ppo", "reward=model", f"reward.init_from={rm}"))
    exp = build(cfg, str(tmp_path / "ppo"))
    with jax.set_mesh(exp.mesh), nnx.logical_axis_rules(exp.rules):
        parts = split_models(exp)
        models = nnx.merge(parts.graphdef, parts.params, parts.rest)
        frozen = nnx.merge(parts.frozen_graphdef, parts.frozen)
        batch = {k: jnp.asarray(v[None]) for k, v in exp.eval_batches[0].items() if v.dtype.kind in "iu"}
        xp = nnx.jit(lambda m, f, b: exp.algorithm.collect(m, f, (), b, jax.random.key(0), True))(models, frozen, batch)
        assert exp.algorithm.score is None and xp["rm_scores"].shape == (1, 8)  # on device, nothing on the host
        tok = exp.tokenizer
        texts = [str(i * 7) for i in range(8)]  # completions of different lengths, then EOS and padding
        completion = np.zeros((8, 4), np.int32)
        for i, t in enumerate(texts):
            completion[i, :len(t) + 1] = [*tok.encode(t), tok.eos_id]
        x = {**jax.tree.map(lambda v: v[0], xp), "completion": jnp.asarray(completion),
             "completion_mask": jnp.asarray(
                 (np.arange(4) <= np.array([len(t) for t in texts])[:, None]).astype(np.int32))}
        got = nnx.jit(model_scores)(frozen.reward_model, x)
    ids, pmask = np.asarray(x["prompt_ids"]), np.asarray(x["prompt_mask"])
    prompts = [tok.decode(p[m > 0][1:].tolist()) for p, m in zip(ids, pmask, strict=True)]  # without BOS
    np.testing.assert_allclose(np.asarray(got), score_texts(rm, prompts, texts), atol=1e-5)
    exported_head_scores_like_generate(rm, tmp_path / "hf", capsys)
    ppo = tmp_path / "ppo_run"  # and a whole run scored by it, through the CLI
    res = run_cli(args(tmp_path, ppo, "reward=model", f"reward.init_from={rm}", "trainer.steps=2"), cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    assert [r["step"] for r in read_metrics(ppo) if "train/objective/scores" in r] == [1, 2]


def exported_head_scores_like_generate(rm: str, out, capsys) -> None:
    """`stack.tools.hf export` of the RM is what TRL's RewardTrainer saves: transformers'
    AutoModelForSequenceClassification loads it with no missing or unused weight and gives the
    scores `python -m stack.tools.generate --score` prints, for the run and for the HF dir alike."""
    transformers = pytest.importorskip("transformers", reason="the export check needs transformers")
    torch = pytest.importorskip("torch", reason="the export check needs torch")

    from stack.tools.generate import main as generate_main
    from stack.tools.hf import export

    export(rm, str(out))
    capsys.readouterr()
    generate_main([rm, "--prompt", "copy abc=", "--score", "abc", "--score", "abd"])
    ours = [float(line.split("\t")[0]) for line in capsys.readouterr().out.splitlines()]
    hf, info = transformers.AutoModelForSequenceClassification.from_pretrained(str(out), output_loading_info=True)
    assert type(hf).__name__ == "LlamaForSequenceClassification" and hf.config.num_labels == 1
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    with torch.no_grad():
        ids = [[1, *(b + 3 for b in f"copy abc={c}".encode()), 2] for c in ("abc", "abd")]  # bytes: BOS .. EOS
        theirs = hf.eval()(torch.tensor(ids)).logits[:, 0].numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-3)  # printed with 4 decimals
    generate_main([str(out), "--prompt", "copy abc=", "--score", "abc", "--score", "abd"])  # the HF dir itself
    assert [float(line.split("\t")[0]) for line in capsys.readouterr().out.splitlines()] == ours
