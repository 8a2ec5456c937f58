"""The model families in training: LoRA's rules find each family's projections and only the adapters
move; every algorithm runs on the families furthest from Llama (Gemma 3, Qwen3-MoE); the
experts' load-balancing loss is logged and weighted into the loss; the platform
kernel computes a Gemma 3 forward (sliding and global layers, its scale) as the core does; the
family keys' errors name the key."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stack.config.validate import validate
from stack.engine.trainer import Trainer, train
from stack.errors import ConfigError
from stack.models.init import init_model
from stack.models.llama import use_attention
from stack.run.build import build
from tests.helpers import captured, forward, make_cfg

FAMILIES = ["qwen2", "qwen3", "mistral", "gemma3"]
QUICK = ["trainer.eval_batches=1", "trainer.log_every=1", "logger=[]", "checkpoint=none"]


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_trains_only_the_adapters_of_every_projection(family, tmp_path):
    cfg = make_cfg([f"model={family}", "quantization=lora", "trainer.steps=3", f"run_dir={tmp_path}", *QUICK])
    exp = build(cfg, str(tmp_path))
    before = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(exp.model)))
    trainer = Trainer(exp)
    trainer.run()
    after = nnx.to_pure_dict(nnx.state(trainer.policy()))
    moved = jax.tree_util.tree_leaves_with_path(
        jax.tree.map(lambda a, b: bool((np.asarray(a) != b).any()), after, before))
    names = {jax.tree_util.keystr(p) for p, changed in moved if changed}
    assert names and all("lora_a" in n or "lora_b" in n for n in names), names
    for projection in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        assert any(projection in n and "lora_b" in n for n in names), (projection, sorted(names)[:4])


@pytest.mark.slow  # 2 runs, ~10 s: the default tier's LoRA test above finds the same projections
@pytest.mark.parametrize("quant", [["quantization=qlora_nf4", "quantization.rules.0.tile_size=16"],
                                   ["quantization=int8_qat"]], ids=["qlora", "qat"])
def test_qlora_and_qat_rules_train_gemma3(quant, tmp_path):
    """Qwix's rules match Gemma 3's projections (an untouched model would not move at all)."""
    cfg = make_cfg(["model=gemma3", "trainer.steps=3", f"run_dir={tmp_path}", *QUICK, *quant])
    exp, sink = captured(build(cfg, str(tmp_path)))
    train(exp)
    losses = [r["train/loss"] for r in sink.rows if "train/loss" in r]
    assert len(losses) == 3 and np.isfinite(losses).all() and losses[-1] != losses[0]


ALGORITHMS = {
    "sft": ["trainer.steps=20"],
    "dpo": ["algorithm=dpo", "data=jsonl_prefs", "data.batch_size=4", "trainer.steps=20"],
    "rm": ["algorithm=rm", "data=jsonl_prefs", "data.batch_size=4", "trainer.steps=20"],
    "grpo": ["algorithm=grpo", "data=jsonl_prompts", "algorithm.num_generations=4", "algorithm.max_new_tokens=4",
             "data.batch_size=4", "trainer.steps=2"],
    "ppo": ["algorithm=ppo", "data=jsonl_prompts", "algorithm.max_new_tokens=4", "data.batch_size=4",
            "algorithm.num_ppo_epochs=1", "trainer.steps=2"],
}


@pytest.mark.slow  # 10 runs, ~40 s of CPU
@pytest.mark.parametrize("model", ["gemma3", "qwen3_moe"])
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_runs_on_gemma3_and_qwen3_moe(algorithm, model, tmp_path):
    """20 steps (2 rounds for GRPO and PPO) with finite losses throughout; SFT lowers its held-out loss
    (the preference objectives of a random tiny model moved less than their batch-to-batch noise in as
    few steps)."""
    cfg = make_cfg([f"model={model}", f"run_dir={tmp_path}", *QUICK, *ALGORITHMS[algorithm]])
    exp, sink = captured(build(cfg, str(tmp_path)))
    summary = train(exp)
    if exp.rewards is not None:
        exp.rewards.close()
    losses = [r["train/loss"] for r in sink.rows if "train/loss" in r]
    assert losses and np.isfinite(losses).all()
    if algorithm == "sft":
        assert summary.eval["eval/loss"] < summary.eval_at_start["eval/loss"]


def test_a_gemma3_forward_with_the_splash_kernel_equals_the_core():
    """Its sliding layer through splash's LocalMask, its global one causal, scaled by query_pre_attn_scalar."""
    cfg = make_cfg(["model=gemma3", "model.sliding_window=100", "model.head_dim=64"])
    core = init_model(cfg.model, 0)
    splash = use_attention(init_model(cfg.model, 0), "splash", interpret=True)
    tokens = jax.random.randint(jax.random.key(1), (2, 256), 0, cfg.model.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(256, dtype=jnp.int32), (2, 256))
    seg = jnp.ones((2, 256), jnp.int32)
    np.testing.assert_allclose(np.asarray(forward(splash, tokens, positions, seg)),
                               np.asarray(forward(core, tokens, positions, seg)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("algorithm", ["sft", "dpo"])
def test_the_load_balancing_loss_is_logged_and_weighted_into_the_loss(algorithm, tmp_path):
    """model.router_aux_loss_coef c: the first step's loss is the objective's + c · router_aux_loss (the
    same params either way), as transformers' MoE causal LMs add it; null: logged, not added."""
    rows = {}
    for coef in ("null", "0.5"):
        cfg = make_cfg(["model=qwen3_moe", f"model.router_aux_loss_coef={coef}", "trainer.steps=1",
                        f"run_dir={tmp_path}/{coef}", *QUICK, *ALGORITHMS[algorithm][:-1]])
        exp, sink = captured(build(cfg, str(tmp_path / coef)))
        train(exp)
        rows[coef] = next(r for r in sink.rows if "train/loss" in r)
    aux = rows["null"]["train/router_aux_loss"]
    assert aux == pytest.approx(rows["0.5"]["train/router_aux_loss"]) and 1.0 < aux < 3.0  # top 2 of 8: ~2
    assert rows["0.5"]["train/loss"] == pytest.approx(rows["null"]["train/loss"] + 0.5 * aux, rel=1e-5)


@pytest.mark.parametrize("overrides, match", [
    (["model.family=phi3"], "Unknown value 'phi3' for 'model.family'"),
    (["model.hidden_act=relu"], "Unknown value 'relu' for 'model.hidden_act'"),
    (["model.layer_types=[full_attention,sliding_attention]"], "'model.sliding_window' is null"),
    (["model=gemma3", "model.layer_types=[full_attention]"], "one entry per layer \\(model.n_layers=2\\)"),
    (["model=gemma3", "model.scan_layers=true"], "model.scan_layers=true runs one compiled layer"),
    (["model=mistral", "model.sliding_window=0"], "'model.sliding_window'=0 must be null \\(off\\) or > 0"),
    (["model=qwen3_moe", "model.num_experts_per_tok=9"], "1 <= experts per token <= num_experts"),
    (["model.num_experts=4"], "routed experts need both"),
])
def test_bad_family_keys_are_one_clear_error(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(make_cfg(overrides))


@pytest.mark.slow  # Pallas interpret mode, ~11 s; the default tier's sharded test below runs the kernel too
def test_the_megablox_kernel_computes_the_experts_as_ragged_dot_does():
    """TPU's grouped matmul (Pallas megablox, interpret mode on CPU): the same logits and gradients as
    jax.lax.ragged_dot's, rows padded to its tiles (3 x 20 tokens x top 2 = 120 rows: 8 of padding)."""
    from stack.models.moe import use_experts

    cfg = make_cfg(["model=qwen3_moe"]).model
    ragged, megablox = init_model(cfg, 0), use_experts(init_model(cfg, 0), "megablox", interpret=True)
    tokens = jax.random.randint(jax.random.key(2), (3, 20), 0, cfg.vocab_size)

    def loss(model):
        return (model(tokens) ** 2).mean()

    np.testing.assert_allclose(np.asarray(forward(megablox, tokens)), np.asarray(forward(ragged, tokens)),
                               rtol=1e-5, atol=1e-5)
    got, want = (nnx.state(nnx.jit(nnx.grad(loss))(m), nnx.Param) for m in (megablox, ragged))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-6)


SHARDED_EXPERTS = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from stack.models.init import init_model
from stack.models.moe import record_router, router_aux_loss, use_experts
from tests.helpers import make_cfg
cfg = make_cfg(["model=qwen3_moe"]).model
tokens = jax.random.randint(jax.random.key(2), (4, 24), 0, cfg.vocab_size)
plain = record_router(init_model(cfg, 0))
want = np.asarray(nnx.jit(lambda m, t: m(t))(plain, tokens))
want_aux = float(router_aux_loss(plain))
mesh = jax.make_mesh((4,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
rules = (("batch", "fsdp"), ("embed", "fsdp"), ("vocab", None), ("heads", None), ("kv_heads", None), ("mlp", None),
         ("head_dim", None), ("norm", None), ("expert", None))
with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    model = record_router(use_experts(init_model(cfg, 0), "megablox", interpret=True))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
    got = np.asarray(nnx.jit(lambda m, t: m(t))(model, jax.device_put(tokens, rows)))
    aux = float(router_aux_loss(model))
print(json.dumps([float(np.abs(got - want).max()), aux, want_aux]))
"""


def test_the_megablox_experts_run_per_batch_shard_under_a_mesh():
    """Four fake devices, rows over fsdp: each shard routes its own tokens through the (gathered) experts
    with the Pallas kernel; the logits and the load-balancing loss (counts summed over shards) equal one
    device's."""
    import json
    import subprocess
    import sys

    from tests.helpers import REPO, fake_devices

    proc = subprocess.run([sys.executable, "-c", SHARDED_EXPERTS], env={**fake_devices(4), "JAX_PLATFORMS": "cpu"},
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    diff, aux, want_aux = json.loads(proc.stdout.splitlines()[-1])
    assert diff < 1e-5 and aux == pytest.approx(want_aux, rel=1e-6)
