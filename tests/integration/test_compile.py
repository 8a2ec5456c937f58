"""`mode=compile`: AOT-compile the real train step for a TPU topology from this CPU machine.

Tests marked `tpu_extra` need libtpu (`pip install -e ".[tpu]"`, best in a separate venv)
and FAIL without it, with the install command; run them there with
`pytest -m "tpu_extra and not slow" tests/integration/test_compile.py` (add `-m tpu_extra`
alone for the slow 8B compile, ~4 min on 2 cores). The unmarked tests need no libtpu.
"""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from stack.errors import ConfigError
from tests.helpers import make_cfg, run_cli

TINY_V5E = ["hardware=tpu_v5e", "mesh=fsdp", "mode=compile"]  # v5e:2x2, fsdp over 4 chips
GiB = 1024**3


@pytest.fixture
def libtpu():
    if importlib.util.find_spec("libtpu") is None:
        pytest.fail('this test needs libtpu: pip install -e ".[tpu]" (jax[tpu] at the installed '
                    "jax version), in a separate venv; see the module docstring", pytrace=False)


def tpu_extra(test):
    """Mark `test` as needing the tpu extra; without libtpu it fails with the install command."""
    return pytest.mark.tpu_extra(pytest.mark.usefixtures("libtpu")(test))


def compile_cfg(overrides, capsys):
    """(exit code, stdout) of compile_for_target for `overrides`."""
    from stack.run.modes import compile_for_target

    code = compile_for_target(make_cfg(overrides))
    return code, capsys.readouterr().out


def gib(out: str, label: str) -> float:
    """The size printed after `label` (e.g. "per device total:") in GiB."""
    value, unit = re.search(rf"{re.escape(label)} ([\d.]+) (GiB|MiB)", out).groups()
    return float(value) / (1024 if unit == "MiB" else 1)


def test_host_bounds():
    from stack.engine.aot import host_bounds

    assert host_bounds("v5e:2x2") == (2, 2, 1)
    assert host_bounds("v5e:2x4") == (2, 4, 1)  # v5litepod-8: one host with 8 chips
    assert host_bounds("v6e:1x1") == (1, 1, 1)
    assert host_bounds("v5p:2x2x1") == (2, 2, 1)
    assert host_bounds("v5e:4x4") is None and host_bounds("v5p:2x2x2") is None  # libtpu's 2x2x1 hosts


def test_tpu_target_without_libtpu_says_how_to_install(monkeypatch):
    import stack.engine.aot

    real = importlib.util.find_spec
    monkeypatch.setattr(stack.engine.aot.importlib.util, "find_spec",
                        lambda name, *a: None if name == "libtpu" else real(name, *a))
    with pytest.raises(ConfigError, match=re.escape('pip install -e ".[tpu]"')) as e:
        stack.engine.aot.target_devices(make_cfg(TINY_V5E).hardware)
    assert "libtpu" in str(e.value) and "jax[tpu]==" in str(e.value)


def test_cpu_target_compiles_without_libtpu(capsys):
    code, out = compile_cfg(["hardware=cpu", "mode=compile"], capsys)
    assert code == 0, out
    for words in ("per device (train step): arguments", "per device total:", "FLOPs per device per step", "fits:"):
        assert words in out, out


WIDE = ["hardware=cpu", "mode=compile", "model.d_model=1024", "model.n_heads=8", "model.n_kv_heads=2",
        "model.head_dim=128", "model.d_ff=4096", "model.n_layers=2", "model.vocab_size=32000", "data.seq_len=2048",
        "model.max_seq_len=2048", "data.batch_size=1", "model.attention=xla"]


def test_the_train_step_computes_no_more_than_the_model_formula_without_remat(capsys):
    """XLA's FLOPs of the unrolled train step over the model formula (6N + causal attention, MaxText's
    count): within 1.15 without remat (the rest: the kernel's full [T, T] square and the elementwise
    work); model.remat=full recomputes each layer's forward, which shows."""
    ratios = {}
    for remat in ("none", "full"):
        code, out = compile_cfg([*WIDE, f"model.remat={remat}"], capsys)
        assert code == 0, out
        ratios[remat] = float(re.search(r"= ([\d.]+)x the formula", out).group(1))
    assert 1.0 < ratios["none"] <= 1.15 < ratios["full"], ratios


@tpu_extra
def test_tiny_on_v5e_2x2_fits(capsys):
    code, out = compile_cfg(TINY_V5E, capsys)
    assert code == 0, out
    assert "v5e:2x2, 4 device(s), 1 host(s)" in out and "'fsdp': 4" in out
    assert 0 < gib(out, "per device total:") < 0.1 and "of 16.00 GiB HBM" in out
    assert re.search(r"temp [\d.]+ MiB \| code [\d.]+ MiB", out)
    assert re.search(r"predicted step time at the peak 197 TFLOP/s: [\d.e+-]+ ms", out)
    xla, formula = map(float, re.search(r"([\d.e+]+) \(XLA\), ([\d.e+]+) \(model formula\)", out).groups())
    assert 0.9 < xla / formula < 1.2  # XLA also counts softmax, norms, the optimizer update
    assert "fits:" in out and "does not fit" not in out


@tpu_extra
def test_cli_mode_compile(tmp_path):
    cache = {"STACK_CACHE_DIR": str(tmp_path / "cache")}
    for _ in range(2):  # the second finds no cache entry it could not load (jax warned, reading one back)
        res = run_cli(TINY_V5E, cwd=str(tmp_path), env=cache)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "compilation cache" not in res.stderr, res.stderr[-3000:]
    assert not (tmp_path / "cache" / "jax").exists()  # compile-only devices' programs: never cached
    for words in ("per device (train step): arguments", "per device total:", "of 16.00 GiB HBM", "fits:"):
        assert words in res.stdout, res.stdout
    assert "could not determine TPU" not in res.stderr  # libtpu loaded quietly
    res = run_cli(TINY_V5E + ["model=llama3_70b"], cwd=str(tmp_path))
    assert res.returncode == 1 and "does not fit" in res.stdout, res.stdout + res.stderr[-3000:]


@tpu_extra
def test_a_cpu_run_beside_libtpu_initialises_no_tpu_backend(tmp_path):
    """hardware=cpu sets JAX_PLATFORMS=cpu: libtpu, installed for mode=compile, would otherwise
    probe for TPUs at the run's jax start (~0.25 s and a page of errors)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_PLATFORMS", "TPU_"))}
    res = subprocess.run([sys.executable, "-m", "stack", "trainer.steps=2", "trainer.eval_batches=1", "checkpoint=none",
                          f"run_dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "TPU" not in res.stderr and "libtpu" not in res.stderr, res.stderr[-3000:]


@tpu_extra
def test_multi_host_topology_from_one_process(capsys):
    code, out = compile_cfg(TINY_V5E + ["hardware.topology=v5e:4x4"], capsys)
    assert code == 0, out
    assert "v5e:4x4, 16 device(s), 4 host(s)" in out and "'fsdp': 16" in out


@tpu_extra
def test_70b_does_not_fit_v5e_2x2(capsys):
    code, out = compile_cfg(TINY_V5E + ["model=llama3_70b"], capsys)
    # 70.55e9 params x (4 B fp32 param + 8 B Adam mu, nu) / 4 chips = 197.1 GiB per chip
    assert code == 1 and "does not fit: 197.14 GiB > 16.00 GiB" in out, out


LONG = ["data.seq_len=32768", "data.batch_size=4", "model.max_seq_len=32768"]


@tpu_extra
def test_activations_that_do_not_fit(capsys):
    # the state is tiny, but the core's [4, 32768, 32768] attention scores are not: XLA refuses to compile
    code, out = compile_cfg(TINY_V5E + LONG + ["model.attention=core"], capsys)
    assert code == 1 and "does not fit:" in out and "ran out of HBM" in out, out
    assert gib(out, "does not fit:") > 16


@tpu_extra
def test_the_splash_kernel_fits_what_the_core_does_not(capsys):
    """model.attention=null on TPU is the Pallas splash kernel: no [T, T] scores, so 4 x 32,768 tokens
    of the tiny model compile to well under a GiB per chip."""
    code, out = compile_cfg(TINY_V5E + LONG, capsys)
    assert code == 0 and "fits:" in out, out
    assert gib(out, "per device total:") < 1


@pytest.mark.slow
@tpu_extra
def test_llama3_8b_on_v5e_2x4(capsys):
    """8.03e9 params: fp32 params (4 B) + Adam mu, nu (8 B) = 96.4 GB; fsdp over 8 chips gives
    12.05e9 B = 11.22 GiB of donated arguments per chip (outputs alias them). On top: fp32
    gradients (at most 4 B/param / 8 = 3.74 GiB, less when XLA fuses them into the update),
    bf16 all-gathered layer weights and the program itself: 12-16 GiB, tight on 16 GiB."""
    code, out = compile_cfg(TINY_V5E + ["model=llama3_8b", "hardware.topology=v5e:2x4"], capsys)
    assert "v5e:2x4, 8 device(s), 1 host(s)" in out, out
    assert 11.2 < gib(out, "per device (train step): arguments") < 11.5, out
    assert 12 < gib(out, "per device total:") < 16, out
    assert code == 0, out


DPO_VARIANTS = {"copy": [], "precomputed": ["algorithm.precompute_reference=true"], "lora": ["quantization=lora"],
                "qlora": ["quantization=qlora_nf4", "quantization.rules.0.tile_size=16"]}


def test_dpo_step_compiles_for_cpu(capsys):
    args, frozen, collect = {}, {}, {}
    for name, extra in DPO_VARIANTS.items():
        code, out = compile_cfg(["+recipe=llama_dpo", "hardware=cpu", "mode=compile", *extra], capsys)
        assert code == 0 and "fits:" in out, out
        args[name] = gib(out, "per device (train step): arguments")
        frozen[name] = gib(out, "frozen modules")
        collect[name] = gib(out, "per device (collect, once per round): arguments")
    # resident beside the train state: the reference copy; precomputed or LoRA: no second copy.
    # Every program's arguments: params + Adam (2x) + the frozen modules + the data; LoRA: the
    # base once plus small adapters; QLoRA: 4-bit projections (llama_tiny is embedding-heavy).
    from stack.models.init import param_count

    reference_gib = param_count(make_cfg(["+recipe=llama_dpo"]).model) * 4 / GiB
    assert frozen["copy"] == pytest.approx(reference_gib, rel=0.05), frozen
    assert frozen["precomputed"] == frozen["lora"] == frozen["qlora"] == 0, frozen
    assert args["copy"] - args["precomputed"] == pytest.approx(reference_gib, rel=0.05), args
    assert collect["copy"] - collect["precomputed"] == pytest.approx(reference_gib, rel=0.05), collect
    assert args["lora"] < 0.4 * args["copy"] and args["qlora"] < 0.7 * args["lora"], args


@tpu_extra
@pytest.mark.parametrize("variant", list(DPO_VARIANTS))
def test_dpo_on_v5e_2x2_fits(capsys, variant):
    code, out = compile_cfg(["+recipe=llama_dpo", *TINY_V5E, *DPO_VARIANTS[variant]], capsys)
    assert code == 0 and "v5e:2x2" in out and "fits:" in out and "does not fit" not in out, out


def test_grpo_round_compiles_for_cpu_and_counts_the_kv_cache(capsys):
    """Both programs of a GRPO round lower; collect's temporaries hold the KV cache, so 56 more
    new tokens add at least rows x 56 x layers x (K, V) x kv_heads x head_dim x 4 bytes."""
    temp = {}
    for new in (8, 64):
        code, out = compile_cfg(["data=jsonl_prompts", "algorithm=grpo", "hardware=cpu", "mode=compile",
                                 f"algorithm.max_new_tokens={new}"], capsys)
        assert code == 0 and "fits:" in out, out
        temp[new] = gib(out.split("per device (collect, once per round):")[1], "| temp")
    m = make_cfg(["algorithm=grpo", "data=jsonl_prompts"])
    rows = m.data.batch_size * m.algorithm.num_generations
    cache = rows * 56 * m.model.n_layers * 2 * m.model.n_kv_heads * (m.model.d_model // m.model.n_heads) * 4
    assert (temp[64] - temp[8]) * GiB >= cache, (temp, cache)


def test_ppo_with_a_separate_value_trunk_holds_two_trained_models(capsys):
    """PPO's update holds the policy and the value trunk with their optimizer states: its
    arguments are about twice a shared-trunk run's (where only the value head is added)."""
    args = {}
    for shared in ("false", "true"):
        code, out = compile_cfg(["data=jsonl_prompts", "algorithm=ppo", "hardware=cpu", "mode=compile",
                                 f"algorithm.shared_trunk={shared}"], capsys)
        assert code == 0 and "fits:" in out and "per device (collect, once per round):" in out, out
        args[shared] = gib(out, "per device (train step): arguments")
    assert 1.6 < args["false"] / args["true"] < 2.1, args


def test_ppo_scored_by_a_reward_model_holds_it_frozen_at_its_own_size(tmp_path, capsys):
    """reward=model under mode=compile needs only the RM run's config.yaml (shapes, no weights);
    the RM (here 3 layers, the policy 2) is a frozen module of its own exact size."""
    from omegaconf import OmegaConf

    from stack.models.init import param_count

    rm = make_cfg(["algorithm=rm", "data=jsonl_prefs", "model.n_layers=3"])
    (tmp_path / "rm").mkdir()
    OmegaConf.save(rm, tmp_path / "rm" / "config.yaml", resolve=True)
    code, out = compile_cfg(["data=jsonl_prompts", "algorithm=ppo", "hardware=cpu", "mode=compile", "reward=model",
                             f"reward.init_from={tmp_path / 'rm' / 'checkpoints'}"], capsys)
    assert code == 0 and "fits:" in out, out
    frozen = dict(re.findall(r"(\w+) ([\d.]+) MiB frozen", out))
    assert set(frozen) == {"reference", "reward_model"}, out
    want = (param_count(rm.model) + rm.model.d_model) * 4 / 2**20  # float32 trunk + scalar head [d_model, 1]
    assert float(frozen["reward_model"]) == pytest.approx(want, abs=0.006)
    assert float(frozen["reward_model"]) > float(frozen["reference"]) + 0.1  # a third layer, not the policy's copy
