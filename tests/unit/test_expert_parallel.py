"""Expert parallelism (mesh=expert, stack.models.moe): on 8 fake devices the experts split 4 ways over the
`expert` axis give one device's logits, load-balancing loss and gradients; its config errors."""

import json
import subprocess
import sys

import pytest

from stack.config.validate import validate
from stack.errors import ConfigError
from tests.helpers import REPO, fake_devices, make_cfg

SPLIT = """
import json, sys
import jax, numpy as np
from flax import nnx
from stack.models.init import init_model
from stack.models.moe import record_router, router_aux_loss, use_experts
from tests.helpers import make_cfg
cfg = make_cfg(["model=qwen3_moe"]).model
tokens = jax.random.randint(jax.random.key(2), (8, 24), 0, cfg.vocab_size)
loss = lambda m, t: (m(t) ** 2).mean() + router_aux_loss(m)
def run(model):
    logits = np.asarray(nnx.jit(lambda m, t: m(t))(model, tokens))
    aux = float(router_aux_loss(model))
    grads = jax.tree.leaves(nnx.state(nnx.jit(nnx.grad(loss))(model, tokens), nnx.Param))
    text = nnx.jit(lambda m, t: m(t)).lower(model, tokens).as_text()
    return logits, aux, [np.asarray(g) for g in grads], ("all_gather" in text, "reduce_scatter" in text)
want = run(record_router(init_model(cfg, 0)))
mesh = jax.make_mesh((2, 4), ("fsdp", "expert"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
out = {}
for batch in (("fsdp", "expert"), "fsdp"):  # rows split over the expert axis too, or not
    rules = (("batch", batch), ("embed", "fsdp"), ("vocab", None), ("heads", None), ("kv_heads", None),
             ("mlp", None), ("head_dim", None), ("norm", None), ("expert", "expert"))
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
        model = record_router(use_experts(init_model(cfg, 0), sys.argv[1], interpret=True))
        spec = str(model.layers[0].mlp.gate_proj[...].sharding.spec)
        logits, aux, grads, collectives = run(model)
    out[str(batch)] = {"spec": spec, "logits": float(np.abs(logits - want[0]).max()), "aux": [aux, want[1]],
                       "grads": max(float(np.abs(g - w).max() / (np.abs(w).max() + 1e-12))
                                    for g, w in zip(grads, want[2], strict=True)),
                       "collectives": collectives}
print(json.dumps(out))
"""


@pytest.mark.parametrize("kernel", ["ragged", pytest.param("megablox", marks=pytest.mark.slow)])
def test_experts_split_over_the_expert_axis_compute_what_one_device_does(kernel):
    """qwen3_moe (8 experts, top 2) on a 2 x 4 mesh (fsdp x expert), each device 2 experts: the logits,
    the load-balancing loss and every parameter's gradient equal one device's (ragged dot), with XLA's
    ragged dot or the Pallas megablox kernel (interpret mode: it leaves rows outside its groups
    unwritten); with the rows split over the expert axis the tokens are gathered and the outputs
    reduce-scattered (in the program)."""
    proc = subprocess.run([sys.executable, "-c", SPLIT, kernel], env={**fake_devices(8), "JAX_PLATFORMS": "cpu"},
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    for batch, got in out.items():
        assert got["spec"].startswith("P('expert'"), (batch, got)  # experts split 4 ways
        assert got["logits"] < 1e-5 and got["aux"][0] == pytest.approx(got["aux"][1], rel=1e-6), (batch, got)
        assert got["grads"] < 1e-5, (batch, got)
    assert out["('fsdp', 'expert')"]["collectives"] == [True, True]


@pytest.mark.parametrize("overrides, match", [
    (["mesh.expert=2"], r"'mesh.expert'=2 splits the routed experts .* mesh.rules.expert \(now None\)"),
    (["mesh=expert", "mesh.expert=3"], r"model.num_experts=8: it must be a multiple of mesh.expert"),
    (["mesh=expert", "model=llama_tiny"], r"model.num_experts=None"),
])
def test_bad_expert_splits_are_one_clear_error(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(make_cfg(["model=qwen3_moe", *overrides]))


def test_the_expert_mesh_option_validates():
    validate(make_cfg(["model=qwen3_moe", "mesh=expert"]))
