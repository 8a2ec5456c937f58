"""Run by test_meshes.py in a subprocess with 8 fake CPU devices: train 5 steps per mesh.

Prints one JSON object: per-step losses per mesh, per-device shard shapes of a few params, the
peak FLOP/s per device each run's MFU divides by, and the run dir of the mesh run that saved a
checkpoint (`SAVED`), with its trained params beside it in params.npz.
"""

import json
import os
import sys
import tempfile

import jax
import numpy as np
from flax import nnx

from stack.engine.trainer import Trainer
from stack.run.build import build
from tests.helpers import QUICK, captured, make_cfg

BASE = QUICK + ["trainer.steps=5", "data.batch_size=16"]
SAVED = "mesh=fsdp_tp"  # this run also writes a checkpoint (read back on one device by the test)


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
        run_dir = tempfile.mkdtemp()
        saving = ["checkpoint=local", "checkpoint.every=5"] if mesh == SAVED else []
        exp, cap = captured(build(make_cfg(BASE + mesh.split() + saving), run_dir))
        trainer = Trainer(exp)
        trainer.run()
        if saving:
            flat = nnx.to_flat_state(nnx.state(trainer.policy(), nnx.Param))
            np.savez(os.path.join(run_dir, "params.npz"), **{"/".join(map(str, k)): np.asarray(v.get_value())
                                                              for k, v in flat})
            result["saved"] = run_dir
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
        result["shards"][mesh]["adam_mu/q_proj"] = {
            "shards": sorted({tuple(s.data.shape) for s in mu.addressable_shards})}
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
