"""Bad input through the real CLI: one paragraph on stderr, exit code 2, no run dir, no traceback."""

import json
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from tests.helpers import REPO, run_cli


def test_cli_error_is_one_paragraph_with_nonzero_exit(tmp_path):
    res = run_cli(["model.d_modle=64"], cwd=str(tmp_path))
    assert res.returncode == 2
    assert "Did you mean d_model?" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "outputs"), "a run dir was made for a bad config"


def test_cli_full_error_shows_traceback(tmp_path):
    res = run_cli(["model.d_modle=64"], cwd=str(tmp_path), env={"HYDRA_FULL_ERROR": "1"})
    assert res.returncode != 0 and "Traceback" in res.stderr


def test_build_time_error_is_clean(tmp_path):
    res = run_cli(["data=jsonl_sft", "data.path=/nonexistent/*.jsonl", f"run_dir={tmp_path}/r"], cwd=REPO)
    assert res.returncode == 2
    assert "'data.path'" in res.stderr and "/nonexistent/*.jsonl" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("where", ["run", "warm start"])
def test_a_refused_target_leaves_no_run_dir(tmp_path, where):
    """A `_target_` reached through an allowed module, in the run's config or in its warm-start
    stage's overrides, is refused before the run dir and its .lock are made (both were created
    first; the stage's was judged only when it was composed, inside the run dir)."""
    run, target = tmp_path / "r", "optimizer.chain.0._target_=stack.cli.app.os.system"
    args = [target] if where == "run" else ["+recipe=llama_grpo", f"warm_start.overrides=['{target}']"]
    res = run_cli([*args, f"run_dir={run}"], cwd=str(tmp_path))
    assert res.returncode == 2 and "cannot be built: it names a builtin_function_or_method" in res.stderr, res.stderr
    assert where == "run" or res.stderr.startswith("error: The warm-start stage (warm_start.recipe=llama_sft): ")
    assert len(res.stderr.strip().splitlines()) == 1 and not run.exists()


def test_data_kind_and_vocab_are_checked_against_algorithm_and_model(tmp_path):
    for args, message in [
        (["data=jsonl_prefs"], "'data.kind'='preference' does not fit algorithm='sft', which reads sft or text"),
        (["model.vocab_size=200"], "'model.vocab_size'=200 is smaller than the tokenizer's vocabulary (259"),
    ]:
        res = run_cli(args + ["mode=validate"], cwd=str(tmp_path))
        assert res.returncode == 2 and message in res.stderr, res.stderr


def test_cfg_job_prints_config_without_importing_jax():
    code = ("import sys; from stack.cli.app import preflight; preflight(['+recipe=llama_sft', '--cfg', 'job']); "
            "assert 'jax' not in sys.modules, 'jax was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    out = subprocess.run([sys.executable, "-m", "stack", "+recipe=llama_sft", "--cfg", "job"],
                         capture_output=True, text=True, check=True, cwd=REPO).stdout
    cfg = OmegaConf.create(out)
    assert cfg.data.name == "jsonl_sft" and cfg.model.d_model == 64


def bad_inputs(tmp_path) -> dict[str, tuple[list[str], str]]:
    """A corrupt tokenizer.json, corrupt safetensors for model.init_from, uncreatable run dirs."""
    tok = tmp_path / "tok" / "tokenizer.json"
    tok.parent.mkdir()
    tok.write_text('{"model": {"type": "BPE", "vocab": {')  # cut off
    hf = tmp_path / "hf"
    hf.mkdir()
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 384, "hidden_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176,
           "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "tie_word_embeddings": False}
    (hf / "config.json").write_text(json.dumps(cfg))
    (hf / "model.safetensors").write_bytes(os.urandom(300))
    return {"tokenizer": ([f"data.tokenizer={tok}"], f"{tok} cannot be read as a Hugging Face tokenizer.json"),
            "safetensors": ([f"model.init_from=hf:{hf}"], f"the safetensors weights in '{hf}' cannot be read"),
            "hydra.run.dir": (["hydra.run.dir=/proc/nope/run"], "'hydra.run.dir'='/proc/nope/run' cannot be created"),
            "run_dir": (["run_dir=/proc/nope/run"], "'run_dir'='/proc/nope/run' cannot be created")}


def test_corrupt_files_and_uncreatable_dirs_are_one_paragraph(tmp_path):
    for name, (args, message) in bad_inputs(tmp_path).items():
        run_dir = [] if "dir" in name else [f"run_dir={tmp_path}/run_{name}"]
        res = run_cli(args + run_dir + ["trainer.steps=1"], cwd=str(tmp_path))
        assert res.returncode == 2 and message in res.stderr, (name, res.stderr[-2000:])
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, (name, res.stderr)
        if run_dir:  # an error exit leaves the run dir's lock clean: no "did not exit cleanly" next time
            assert "did not exit cleanly" not in run_cli(args + run_dir, cwd=str(tmp_path)).stdout
