"""LoRA / QLoRA (Qwix) in the generic loop, and DPO's adapters-off reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stack.algorithms.base import Context
from stack.algorithms.dpo import DPO, sequence_logps
from stack.config.validate import validate
from stack.engine.trainer import Trainer
from stack.errors import ConfigError
from stack.models.init import init_model
from stack.quant.providers import make_quantization
from stack.run.build import build
from tests.helpers import QUICK, forward, loss_of, make_cfg, models

LORA = ["quantization=lora", "quantization.rules.0.rank=4", "quantization.rules.0.alpha=12.0"]
QLORA = ["quantization=qlora_nf4", "quantization.rules.0.tile_size=16"]


def lora_model(overrides, seed=0):
    cfg = make_cfg(overrides)
    return cfg, make_quantization(cfg.quantization, seed).apply(init_model(cfg.model, seed))


def random_adapters(model, seed=1):
    """Give every LoRA B a random value (B starts at zero, which would hide the adapters)."""
    rng = np.random.default_rng(seed)
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)):
        var.set_value(jnp.asarray(rng.normal(scale=0.05, size=var.get_value().shape), jnp.float32))


def tokens(seed=0, shape=(2, 16)):
    return np.random.default_rng(seed).integers(3, 300, size=shape).astype(np.int32)


def test_lora_forward_equals_merged_weights_by_hand():
    """The adapted model equals the plain model with W + (alpha / rank) A B in every projection."""
    cfg, model = lora_model(LORA)
    random_adapters(model)
    plain = init_model(cfg.model, 0)
    flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    n = 0
    for path, var in nnx.to_flat_state(nnx.state(plain, nnx.Param)):
        if path[-1] == "kernel" and path[-2].endswith("proj"):
            a, b = flat[(*path[:-1], "kernel_lora_a")].get_value(), flat[(*path[:-1], "kernel_lora_b")].get_value()
            var.set_value(var.get_value() + (12.0 / 4) * a @ b)
            n += 1
    assert n == 7 * cfg.model.n_layers
    x = tokens()
    np.testing.assert_allclose(np.asarray(forward(model, x)), np.asarray(forward(plain, x)), atol=2e-5)


def centered_cosine(a, b):
    a, b = np.array(a), np.array(b)
    a, b = a - a.mean(-1, keepdims=True), b - b.mean(-1, keepdims=True)
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))


def test_qlora_stores_4bit_base_weights_and_stays_close_to_float():
    cfg, model = lora_model(QLORA)
    qvalues = [v for p, v in nnx.to_flat_state(nnx.state(model)) if p[-1] == "qvalue"]
    assert len(qvalues) == 7 * cfg.model.n_layers and all(v.get_value().dtype == jnp.uint4 for v in qvalues)
    _, int8 = lora_model(QLORA + ["quantization.rules.0.weight_qtype=int8"])
    x = tokens(shape=(4, 32))
    full = forward(init_model(cfg.model, 0), x)
    nf4_cos, int8_cos = centered_cosine(forward(model, x), full), centered_cosine(forward(int8, x), full)
    assert 0.99 < nf4_cos < int8_cos and int8_cos > 0.9999, (nf4_cos, int8_cos)


def test_dpo_reference_with_lora_is_the_base_model_without_a_copy():
    cfg, model = lora_model(LORA + ["algorithm=dpo", "data=jsonl_prefs"])
    dpo = DPO(beta=0.1)
    assert dpo.setup(model, Context(make_quantization(cfg.quantization, 0))).frozen == {}  # no second copy
    x = tokens(shape=(3, 2, 16))
    mask = (np.random.default_rng(2).random((3, 2, 16)) > 0.3).astype(np.float32)
    batch = {"inputs": x, "targets": x, "loss_mask": mask}

    def dpo_loss(model):
        stacked = jax.tree.map(lambda v: jnp.asarray(v)[None], batch)
        xp = dpo.collect(models(model), None, (), stacked, jax.random.key(0), True)
        return loss_of(dpo, model, jax.tree.map(lambda v: v[0], xp))

    loss, _ = dpo_loss(model)
    assert float(loss) == pytest.approx(0.6931471824645996, abs=1e-6)  # B = 0: policy == reference

    random_adapters(model)
    _, m = dpo_loss(model)
    base = init_model(cfg.model, 0)  # an independent model without adapters
    flat = lambda k: batch[k].reshape(6, 16)  # noqa: E731
    ref, _ = sequence_logps(forward(base, flat("inputs")), flat("targets"), flat("loss_mask"))
    pol, _ = sequence_logps(forward(model, flat("inputs")), flat("targets"), flat("loss_mask"))
    chosen = 0.1 * (np.asarray(pol)[0::2] - np.asarray(ref)[0::2])
    assert abs(chosen).max() > 1e-3
    assert float(m["rewards/chosen"]) == pytest.approx(chosen.mean(), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("quant", [LORA, QLORA], ids=["lora", "qlora"])
def test_training_moves_only_the_adapters(tmp_path, quant):
    cfg = make_cfg(["+recipe=llama_dpo", "trainer.steps=3", "checkpoint=none", f"run_dir={tmp_path}", *QUICK, *quant])
    exp = build(cfg, str(tmp_path))
    before = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(exp.model)))
    trainer = Trainer(exp)
    trainer.run()
    after = nnx.to_pure_dict(nnx.state(trainer.policy()))
    lora = nnx.to_pure_dict(nnx.state(trainer.policy(), nnx.LoRAParam))
    moved = jax.tree_util.tree_leaves_with_path(
        jax.tree.map(lambda a, b: bool((np.asarray(a) != b).any()), after, before))
    moved_names = {jax.tree_util.keystr(p) for p, changed in moved if changed}
    assert moved_names and all("lora_b" in n or "lora_a" in n for n in moved_names), moved_names
    assert any("lora_b" in n for n in moved_names)
    n_lora = sum(x.size for x in jax.tree.leaves(lora))
    n_opt = sum(x.size for x in jax.tree.leaves(trainer.state.opt_state) if x.ndim)
    assert n_opt == 2 * n_lora  # Adam's mu and nu for the adapters only


def test_bad_lora_configs_fail_with_the_key():
    with pytest.raises(ConfigError, match=r"tile_size' is required"):
        validate(make_cfg(["quantization=qlora_nf4", "quantization.rules.0.tile_size=null"]))
    with pytest.raises(ConfigError, match=r"weight_qtype.*Available"):
        validate(make_cfg(["quantization=lora", "+quantization.rules.0.weight_qtype=nf8"]))
    with pytest.raises(ConfigError, match=r"rules.0.rank'=0"):
        validate(make_cfg(["quantization=lora", "quantization.rules.0.rank=0"]))
    with pytest.raises(ConfigError, match=r"model.scan_layers=true.*method='lora'.*quantization=none"):
        validate(make_cfg(["quantization=lora", "model.scan_layers=true"]))
    with pytest.raises(ConfigError, match=r"reference.init_from.*quantization=lora"):
        validate(make_cfg(["algorithm=dpo", "data=jsonl_prefs", "quantization=lora",
                           "algorithm.reference.init_from=/tmp/x"]))


def test_ppo_with_lora_trains_only_the_adapters_and_the_value_head():
    """The value head sits on the policy's trunk, the reference is the base with adapters off (no
    copy), and the trained params are the adapters plus the head (stack.engine.step's filter)."""
    from stack.algorithms.ppo import PPO
    from stack.data.tokenizers import ByteTokenizer
    from stack.engine.step import Models, trained_filter

    cfg, model = lora_model(LORA + ["algorithm=ppo", "data=jsonl_prompts"])
    quant = make_quantization(cfg.quantization, 0)
    setup = PPO().setup(model, Context(quant, ByteTokenizer(), None))
    assert setup.frozen == {} and setup.trained["value"].trunk is None
    _, params, _ = nnx.split(Models(policy=model, **setup.trained), trained_filter(quant.trainable), ...)
    paths = ["/".join(map(str, p)) for p, _ in nnx.to_flat_state(params)]
    assert "value/head/kernel" in paths and len(paths) == 1 + len(nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)))
    assert all(p == "value/head/kernel" or "lora" in p for p in paths), paths
    random_adapters(model)  # the reference is the adapters-off view even beside other frozen modules (a reward model)
    from types import SimpleNamespace

    from stack.algorithms.reference import Reference

    reference = Reference()
    reference.setup(model, Context(quant))
    view = reference.model(SimpleNamespace(policy=model), SimpleNamespace(reward_model=None))
    assert all(float(jnp.abs(v.get_value()).max()) == 0.0 for _, v in nnx.to_flat_state(nnx.state(view, nnx.LoRAParam)))
