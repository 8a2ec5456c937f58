"""A run's saved params read back for use outside its own resume: `model.init_from`, a DPO
reference or a reward model from a checkpoint, export and generation (stack.checkpoint.policy). They are
read as host arrays whatever mesh wrote them, then laid out like the receiving model's own.
"""

import os
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx
from omegaconf import DictConfig, OmegaConf

from stack.checkpoint.errors import quiet_failed_reads, unreadable_step
from stack.config.quantization import has_adapters, is_post_training
from stack.errors import ConfigError, short

ARCHITECTURE = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "tie_embeddings")


class Saved(NamedTuple):
    """The params of one checkpoint step, as host arrays."""

    tree: dict[str, Any]  # {"policy": ..., <extra trained module>: ...}
    step: int
    adapters_only: bool  # a LoRA/QLoRA run: "policy" holds the adapters, not the base weights
    quantized: bool = False  # `python -m stack.tools.quantize` wrote it: quantized weights and scales
    model: dict[str, Any] | None = None  # the writing run's `model` config (None: not recorded)


def read_run_config(path: str) -> DictConfig:
    """A run's config.yaml; ConfigError in one paragraph when it is not one (unreadable, not YAML
    OmegaConf loads: a python tag, a NUL byte, or not a mapping)."""
    try:
        cfg = OmegaConf.load(path)
    except Exception as exc:  # yaml's ScannerError / ConstructorError, OSError, UnicodeDecodeError, ...
        why = short(" ".join(str(exc).split()), 200)
        raise ConfigError(f"{path!r} cannot be read as a run's config ({type(exc).__name__}: {why}); it is not the "
                          "config.yaml a stack run writes: restore it, or give another run dir.") from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"{path!r} holds a {type(cfg).__name__}, not the mapping of a run's config.yaml; restore "
                          "it, or give another run dir.")
    return cfg


def checkpoints_of(path: str) -> str:
    """`path`, or `path/checkpoints` when `path` is a run dir (its config.yaml and checkpoints/
    inside): wherever a run's checkpoints dir is asked for, the run dir stands for it. A run dir
    without checkpoints/ is refused, saying what its config.yaml says of them."""
    config = os.path.join(path, "config.yaml")
    if "://" in path or not os.path.isfile(config):
        return path
    inner = os.path.join(path, "checkpoints")
    if os.path.isdir(inner):
        return inner
    c = read_run_config(config).get("checkpoint") or {}
    if c.get("name", "none") == "none":
        why = "saved none (it ran with checkpoint=none); train with checkpoint=local to save them in RUN/checkpoints"
    else:
        why = (f"wrote them to checkpoint.path={c.get('path')!r}; give that dir, or leave checkpoint.path unset "
               "so that they go to RUN/checkpoints, beside RUN/config.yaml")
    raise ConfigError(f"{path!r} is a stack run's dir with no checkpoints/ inside: the run {why}.")


def read_params(path: str, step: int | None = None) -> Saved:
    """The saved params of a checkpoints dir or its run dir (newest step, or `step`), as host arrays."""
    path = checkpoints_of(path)
    if not os.path.isdir(path) and "://" not in path:
        raise ConfigError(f"{path!r}: no such checkpoints dir (expected a run's checkpoints/ folder).")
    root = os.path.abspath(path) if "://" not in path else path
    manager = ocp.CheckpointManager(root)
    step = manager.latest_step() if step is None else step
    if step is None:
        manager.close()
        raise ConfigError(f"{path!r} holds no complete checkpoint step.")
    try:
        meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        saved = _host_params(epath.Path(root) / str(step) / "state")
    except Exception as exc:  # Orbax / TensorStore on damaged files: one paragraph, not ~50 lines
        quiet_failed_reads()
        raise unreadable_step(path, step, manager.all_steps(), exc) from None
    finally:
        manager.close()
    config = meta.get("config", {})
    quant = OmegaConf.create(config.get("quantization") or {"method": "none"})
    return Saved(saved if meta.get("format", 1) >= 2 else {"policy": saved}, step, has_adapters(quant),
                 is_post_training(quant), config.get("model"))


def _host_params(state_dir: epath.Path) -> Any:
    """The `params` subtree of a saved TrainState as numpy arrays, whatever mesh and device count
    wrote it (restoring with the saved shardings fails on another topology); the optimizer state
    is not read (a partial restore)."""
    handler = ocp.PyTreeCheckpointHandler()
    try:
        shapes = handler.metadata(state_dir)["params"]
        host = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), shapes)
        args = ocp.args.PyTreeRestore(item={"params": shapes}, restore_args={"params": host}, partial_restore=True)
        return handler.restore(state_dir, args=args)["params"]
    finally:
        handler.close()


def load_params(model: Any, path: str, step: int | None = None) -> int:
    """Overwrite `model`'s params with the policy's of a checkpoints dir (newest step, or
    `step`); returns the step read. An adapters-only (LoRA) checkpoint is refused: merge it first."""
    tree, step, adapters_only, quantized, written_for = read_params(path, step)
    if quantized:
        raise ConfigError(f"Checkpoint {path}/{step} holds post-training-quantized weights (python -m "
                          "stack.tools.quantize): training and model.init_from need float params. Start from the float "
                          f"run's checkpoints, or export dequantized weights: `python -m stack.tools.hf export {path} "
                          "--out DIR`, then hf:DIR.")
    if adapters_only:
        raise ConfigError(f"Checkpoint {path}/{step} was trained with LoRA/QLoRA: it holds the adapters only, not "
                          f"a full model. Merge them into the base first: `python -m stack.tools.hf export {path} "
                          "--out DIR --merge-adapters`, then use hf:DIR (e.g. model.init_from=hf:DIR).")
    assign_params(model, tree["policy"], f"{path}/{step}{_model_of(written_for)}")
    return step


def _model_of(model: dict[str, Any] | None) -> str:
    """' (written for model=NAME: d_model=.., ...; ...)': how to build the model a checkpoint fits."""
    if not model:
        return ""
    shape = ", ".join(f"{k}={model[k]}" for k in ARCHITECTURE if k in model)
    return (f" (written for model={model.get('name')}: {shape}; pass model={model.get('name')} or these "
            "model.* values to read it)")


def assign_params(model: Any, saved: dict[str, Any], where: str, which: Any = None) -> None:
    """Overwrite `model`'s params (or the variables of the nnx filter `which`) with the arrays of
    the nested dict `saved` (host arrays from `read_params`, or a model's own), each laid out like
    the model's own."""
    for keys, var in nnx.to_flat_state(nnx.state(model, which or nnx.Param)):
        node = saved
        for k in map(str, keys):
            if not isinstance(node, dict) or k not in node:
                raise ConfigError(f"Checkpoint {where} has no param {'.'.join(map(str, keys))}: "
                                  "it was written for another model.")
            node = node[k]
        if isinstance(node, dict):  # format 1 kept each param's nnx Variable wrapper: {"value": array}
            node = node["value"]
        current = var.get_value()
        if tuple(node.shape) != tuple(current.shape):
            raise ConfigError(f"Checkpoint {where}: param {'.'.join(map(str, keys))} has shape "
                              f"{tuple(node.shape)}, the model expects {tuple(current.shape)}.")
        var.set_value(jax.device_put(node.astype(current.dtype), current.sharding))
