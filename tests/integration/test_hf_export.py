"""A trained run's checkpoint -> `python -m stack.tools.hf export` -> transformers loads it with the
same logits -> `model.init_from=hf:DIR` starts a run from it with the same eval loss."""

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the reference needs torch (pip install -e '.[hf]', Python 3.11)")
transformers = pytest.importorskip("transformers", reason="the reference needs transformers (the hf extra)")

from stack.checkpoint.saved_params import load_params  # noqa: E402
from stack.errors import ConfigError  # noqa: E402
from stack.models.init import init_model  # noqa: E402
from tests.helpers import make_cfg, run_cli  # noqa: E402

RUN = ["+recipe=llama_sft", "trainer.log_every=5", "trainer.eval_every=0", "trainer.eval_batches=2",
       "data.batch_size=8", "logger=jsonl"]


def test_export_loads_in_transformers_and_imports_back(tmp_path):
    a = tmp_path / "a"
    res = run_cli(RUN + ["trainer.steps=10", "checkpoint=local", f"run_dir={a}"], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    out = tmp_path / "hf"
    exported = subprocess.run([sys.executable, "-m", "stack.tools.hf", "export", str(a / "checkpoints"),
                               "--out", str(out)],
                              capture_output=True, text=True)
    assert exported.returncode == 0, exported.stderr
    assert "exported step 10" in exported.stdout
    config = json.loads((out / "config.json").read_text())  # the byte tokenizer's specials (ByteTokenizer)
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "hf"]  # written beside, renamed: no partial dir left
    weights = (out / "model.safetensors").stat().st_mtime_ns
    again = subprocess.run([sys.executable, "-m", "stack.tools.hf", "export", str(a / "checkpoints"), "--out", str(out),
                            "--dtype", "bfloat16"], capture_output=True, text=True)
    assert again.returncode == 2 and "already exists and is not empty" in again.stderr and "--overwrite" in again.stderr
    assert (out / "model.safetensors").stat().st_mtime_ns == weights and len(again.stderr.splitlines()) == 1

    cfg = make_cfg(RUN)
    ours = init_model(cfg.model, 1)
    assert load_params(ours, str(a / "checkpoints")) == 10
    tokens = np.random.default_rng(0).integers(0, cfg.model.vocab_size, size=(2, 24))
    theirs = transformers.LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        want = theirs(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours(tokens)), want, atol=1e-4)

    b = tmp_path / "b"
    res = run_cli(RUN + ["trainer.steps=1", f"model.init_from=hf:{out}", f"run_dir={b}"], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    final_a = [json.loads(x) for x in open(a / "metrics.jsonl")][-1]["eval/loss"]
    start_b = json.loads(open(b / "metrics.jsonl").readline())["eval/loss"]
    assert start_b == pytest.approx(final_a, rel=1e-5)


def generate_cli(path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stack.tools.generate", str(path), *args],
                          capture_output=True, text=True)


def test_generate_from_a_checkpoint_and_from_its_hf_export_match_transformers(tmp_path):
    a, out = tmp_path / "a", tmp_path / "hf"
    assert run_cli(RUN + ["trainer.steps=20", "checkpoint=local", f"run_dir={a}"], cwd=str(tmp_path)).returncode == 0
    assert subprocess.run([sys.executable, "-m", "stack.tools.hf", "export", str(a), "--out", str(out)],  # a run dir
                          capture_output=True).returncode == 0  # stands for its checkpoints dir
    prompts = ["--prompt", "12+7=", "--prompt", "3+45="]
    ours = generate_cli(a / "checkpoints", *prompts, "--greedy", "--max-new-tokens", "5")
    assert ours.returncode == 0, ours.stderr[-2000:]
    assert generate_cli(out, *prompts, "--greedy", "--max-new-tokens", "5").stdout == ours.stdout
    theirs = transformers.LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    lines = ours.stdout.splitlines()
    for prompt, line in zip(("12+7=", "3+45="), lines, strict=True):
        ids = torch.tensor([[1] + [b + 3 for b in prompt.encode()]])  # BOS, then bytes (ByteTokenizer)
        want = theirs.generate(ids, max_new_tokens=5, do_sample=False, eos_token_id=2, pad_token_id=0)[0, ids.shape[1]:]
        text = bytes(t - 3 for t in want.tolist() if 3 <= t < 259).decode(errors="replace")
        assert line == prompt + text
    sampled = generate_cli(a, "--prompt", "12+7=", "--temperature", "0.9", "--top-p", "0.9",
                           "--num-samples", "3", "--seed", "1")
    assert sampled.returncode == 0 and len(sampled.stdout.splitlines()) == 3


def test_generate_explains_a_bad_path_and_an_impossible_length(tmp_path):
    res = generate_cli(tmp_path / "nothing", "--prompt", "x")
    assert res.returncode == 2 and "neither a Hugging Face Llama dir" in res.stderr and "Traceback" not in res.stderr
    a = tmp_path / "a"
    assert run_cli(RUN + ["trainer.steps=1", "checkpoint=local", f"run_dir={a}"], cwd=str(tmp_path)).returncode == 0
    res = generate_cli(a / "checkpoints", "--prompt", "x", "--max-new-tokens", "5000")
    assert res.returncode == 2 and "max_seq_len=2048" in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # main tier: a faster sibling covers it; CI runs the slow tier
def test_lora_export_with_merged_adapters_matches_the_adapted_model(tmp_path):
    """`--merge-adapters` writes W + (alpha/rank) B A into the safetensors: transformers' logits
    equal the stack model with its adapters (base rebuilt from the run's seed, adapters loaded)."""
    from flax import nnx

    from stack.checkpoint.policy import load_policy
    from stack.checkpoint.saved_params import assign_params, read_params
    from stack.quant.providers import make_quantization
    from stack.tools.hf import export

    lora = ["quantization=lora", "quantization.rules.0.rank=4", "optimizer.lr=1e-2"]
    a, out = tmp_path / "a", tmp_path / "hf"
    res = run_cli(RUN + lora + ["trainer.steps=4", "checkpoint=local", f"run_dir={a}"], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    with pytest.raises(ConfigError, match="adapters only.*pass --merge-adapters"):
        export(str(a / "checkpoints"), str(out))
    merged = subprocess.run([sys.executable, "-m", "stack.tools.hf", "export", str(a / "checkpoints"),
                             "--out", str(out), "--merge-adapters"], capture_output=True, text=True)
    assert merged.returncode == 0, merged.stderr[-2000:]

    cfg = make_cfg(RUN + lora)
    quant = make_quantization(cfg.quantization, cfg.seed)
    adapted = quant.apply(init_model(cfg.model, cfg.seed))
    saved = read_params(str(a / "checkpoints"))
    assert saved.adapters_only and saved.step == 4
    assign_params(adapted, saved.tree["policy"], "test", which=nnx.LoRAParam)
    tokens = np.random.default_rng(0).integers(0, cfg.model.vocab_size, size=(2, 24))
    ours = np.asarray(adapted(tokens))
    theirs = transformers.LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        want = theirs(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(ours, want, atol=1e-4)
    base = np.asarray(init_model(cfg.model, cfg.seed)(tokens))
    assert np.abs(base - want).max() > 1e-3  # the adapters moved: the merge is not a no-op
    with pytest.raises(ConfigError, match="adapters only.*--merge-adapters"):
        load_params(init_model(cfg.model, 0), str(a / "checkpoints"))  # e.g. model.init_from=<a LoRA run>
    policy, _, _ = load_policy(str(a / "checkpoints"))  # what stack.tools.generate samples from: merged here
    np.testing.assert_allclose(np.asarray(policy(tokens)), want, atol=1e-4)


def test_export_is_what_transformers_writes_beside_the_weights_and_shards_above_a_size(tmp_path):
    """Issue 81 item 3: generation_config.json, the byte tokenizer as a tokenizer transformers loads
    (the same ids), the run's chat template (apply_chat_template gives the ids `generate --chat`
    encodes), and shards with their index above `shard_bytes`, loaded with the same logits."""
    from stack.data.tokenizers import ByteTokenizer
    from stack.tools.generate import encode_prompts
    from stack.tools.hf import export

    a = tmp_path / "a"
    res = run_cli(RUN + ["trainer.steps=2", "checkpoint=local", "data.chat_template=chatml", "data.seq_len=256",
                        f"run_dir={a}"],
                  cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    out = tmp_path / "hf"
    assert export(str(a / "checkpoints"), str(out), shard_bytes=300_000) == 2
    generation = transformers.GenerationConfig.from_pretrained(out)
    assert (generation.bos_token_id, generation.eos_token_id, generation.pad_token_id) == (1, 2, 0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = "héllo, 12+7=19\n"
    assert tokenizer(text)["input_ids"] == [1, *ByteTokenizer().encode(text)]
    assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text
    message = [{"role": "user", "content": "What is 2+3?"}]
    chat = tokenizer.apply_chat_template(message, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert chat == encode_prompts(["What is 2+3?"], ByteTokenizer(), ("chatml", "byte"), 2048)[0]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) >= 2 and set(index["weight_map"].values()) == set(shards)
    assert not (out / "model.safetensors").exists()
    cfg = make_cfg(RUN)
    ours = init_model(cfg.model, 1)
    load_params(ours, str(a / "checkpoints"))
    tokens = np.random.default_rng(0).integers(0, cfg.model.vocab_size, size=(2, 16))
    theirs = transformers.LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        np.testing.assert_allclose(np.asarray(ours(tokens)), theirs(torch.tensor(tokens)).logits.numpy(), atol=1e-4)
