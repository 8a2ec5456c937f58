"""Run by test_meshes.py in a subprocess with 8 fake CPU devices: train 5 steps per mesh.

Prints one JSON object: per-step losses per mesh, per-device shard shapes of a few params and the
peak FLOP/s per device each run's MFU divides by.
"""

import json
import sys
import tempfile

import jax
from flax import nnx

from stack.build import build
from stack.trainer import Trainer
from tests.conftest import QUICK, captured, make_cfg

BASE = QUICK + ["trainer.steps=5", "data.batch_size=16"]


def shard_shapes(model, names):
    flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    out = {}
    for name in names:
        arr = flat[tuple(int(p) if p.isdigit() else p for p in name.split("/"))].get_value()
        out[name] = {"global": list(arr.shape), "shards": sorted({tuple(s.data.shape) for s in arr.addressable_shards}),
                     "devices": len(arr.addressable_shards)}
    return out


def main(meshes):
    result = {"devices": jax.device_count(), "losses": {}, "shards": {}, "peaks": {}}
    for mesh in meshes:
        exp, cap = captured(build(make_cfg(BASE + mesh.split()), tempfile.mkdtemp()))
        trainer = Trainer(exp)
        trainer.run()
        result["losses"][mesh] = [r["train/loss"] for r in cap.rows if "train/loss" in r]
        result["peaks"][mesh] = exp.peak_flops_per_device
        if "quantization" in mesh:  # adapters: the losses are what is compared
            continue
        result["shards"][mesh] = shard_shapes(trainer.policy(), ["layers/0/attn/q_proj/kernel", "embed/embedding",
                                                                 "layers/0/mlp/down_proj/kernel"])
        opt_state = trainer.state.opt_state
        adam = next(s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: hasattr(x, "mu")) if hasattr(s, "mu"))
        mu = adam.mu["policy"]["layers"][0]["attn"]["q_proj"]["kernel"]
        mu = mu.get_value() if hasattr(mu, "get_value") else mu
        result["shards"][mesh]["adam_mu/q_proj"] = {"shards": sorted({tuple(s.data.shape) for s in mu.addressable_shards})}
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
