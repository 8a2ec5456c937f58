"""Hugging Face interop (Llama and the families of stack.models.family): safetensors <-> NNX params
(config.json: stack.config.hf_config).

HF's causal LMs use the same rotate-half RoPE as `stack.models.llama`, so q/k need no permutation;
the names (and transposes) of each param: stack.models.hf_names.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh, NamedSharding, SingleDeviceSharding
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from stack.config.hf_config import check_config, hf_config, read_config
from stack.errors import ConfigError, bad_choice
from stack.models.hf_names import Slot, hf_params
from stack.models.shape import LlamaShape

SHARD_BYTES = 5 * 10**9  # one file up to 5 GB, then shards of at most that (the Hugging Face Hub's usual size)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _sharding(x: Any) -> jax.sharding.Sharding:
    """Where a param's new value goes: its own sharding (on the active mesh for an abstract model)."""
    s = getattr(x, "sharding", None)
    if isinstance(s, NamedSharding) and isinstance(s.mesh, AbstractMesh):
        mesh = jax.sharding.get_mesh()
        if mesh.empty:
            raise ConfigError("loading HF weights into an abstract sharded model needs its mesh "
                              "active (jax.set_mesh(mesh)).")
        s = NamedSharding(mesh, s.spec)
    return s or SingleDeviceSharding(jax.devices()[0])


def _tensor_files(root: str) -> dict[str, str]:
    """HF tensor name -> the safetensors file holding it (single file or sharded index)."""
    index = os.path.join(root, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return {name: os.path.join(root, file) for name, file in json.load(f)["weight_map"].items()}
    single = os.path.join(root, "model.safetensors")
    if not os.path.exists(single):
        raise ConfigError(f"{root!r} has neither model.safetensors nor model.safetensors.index.json.")
    with safe_open(single, framework="numpy") as f:
        return {name: single for name in f.keys()}


def _check_tensors(root: str, cfg: LlamaShape, params: dict, files: dict[str, str]) -> dict[str, list[str]]:
    """Names and shapes checked against the model before anything is read; file -> its names."""
    missing = sorted(set(params) - set(files))
    if missing:
        raise ConfigError(f"the checkpoint in {root!r} lacks tensors {missing}.")
    extra = sorted(n for n in set(files) - set(params)
                   if not n.endswith("rotary_emb.inv_freq") and not (n == "lm_head.weight" and cfg.tie_embeddings))
    if extra:
        raise ConfigError(f"the checkpoint in {root!r} has tensors this Llama has no place for: {extra}.")
    by_file: dict[str, list[str]] = {}
    for name in params:
        by_file.setdefault(files[name], []).append(name)
    bad = []
    for file, names in by_file.items():
        with safe_open(file, framework="numpy") as f:
            for name in names:
                var, transpose, index = params[name]
                shape = tuple(var.get_value().shape)[0 if index is None else 1:]
                want, got = shape[::-1] if transpose else shape, tuple(f.get_slice(name).get_shape())
                if got != want:
                    bad.append(f"{name}: expected {want}, got {got}")
    if bad:
        raise ConfigError(f"wrong tensor shapes in the checkpoint in {root!r}: {'; '.join(bad)}.")
    return by_file


def load_hf_weights(model: nnx.Module, cfg: LlamaShape, path: str) -> None:
    """Load a HF Llama checkpoint (`hf:DIR` or `DIR`) into `model` in place.

    Reads `config.json` (checked against `cfg`) and `model.safetensors` or the shards of
    `model.safetensors.index.json`. All names and shapes are checked before anything is
    written; each param keeps its dtype and sharding (an abstract model works too).
    """
    root = path.removeprefix("hf:")
    check_config(read_config(root), cfg)
    _load(root, cfg, hf_params(model))


def load_hf_reward(trunk: nnx.Module, head: nnx.Module, cfg: LlamaShape, path: str) -> None:
    """Load a HF LlamaForSequenceClassification with one label (TRL's reward model) into `trunk`
    (a Llama) and `head` (a stack.models.heads.ScalarHead, from `score.weight`). The checkpoint
    has no LM head: the trunk's is zeroed (a score reads the final hidden states only)."""
    root = path.removeprefix("hf:")
    check_config(read_config(root), cfg, reward=True)
    params = hf_params(trunk)
    lm_head = params.pop("lm_head.weight", None)
    _load(root, cfg, {**params, "score.weight": Slot(head.kernel, True)})
    if lm_head is not None:
        zeros = np.zeros(lm_head[0].get_value().shape, lm_head[0].get_value().dtype)
        lm_head[0].set_value(jax.make_array_from_callback(zeros.shape, _sharding(lm_head[0].get_value()),
                                                          lambda i: zeros[i]))


def _load(root: str, cfg: LlamaShape, params: dict[str, Slot]) -> None:
    """The tensors of `root` named in `params` into their variables (all checked first); an expert's
    slices are stacked once all are read."""
    experts: dict[int, tuple[nnx.Variable, dict[int, np.ndarray]]] = {}
    try:
        for file, names in _check_tensors(root, cfg, params, _tensor_files(root)).items():
            with safe_open(file, framework="numpy") as f:  # bf16 comes as ml_dtypes.bfloat16
                for name in names:
                    var, transpose, index = params[name]
                    arr = f.get_tensor(name)
                    arr = (arr.T if transpose else arr).astype(var.get_value().dtype)
                    if index is None:
                        _set(var, arr)
                    else:
                        experts.setdefault(id(var), (var, {}))[1][index] = arr
    except SafetensorError as e:
        raise ConfigError(f"the safetensors weights in {root!r} cannot be read ({e}): the files are corrupt or "
                          "truncated; re-download or re-export them.") from None
    for var, slices in experts.values():
        _set(var, np.stack([slices[e] for e in range(len(slices))]))


def _set(var: nnx.Variable, arr: np.ndarray) -> None:
    """`arr` into `var`, in the sharding its current value has."""
    var.set_value(jax.make_array_from_callback(arr.shape, _sharding(var.get_value()), lambda i: arr[i]))


def export_hf(model: nnx.Module, cfg: LlamaShape, out_dir: str, tokenizer_dir: str | None = None,
              dtype: str = "float32", specials: dict[str, int | None] | None = None,
              score: np.ndarray | None = None, shard_bytes: int = SHARD_BYTES) -> None:
    """Write `model` as a HF LlamaForCausalLM: config.json (`specials`: bos/eos/pad_token_id), the
    weights in `dtype` (model.safetensors, or above `shard_bytes` shards and their
    model.safetensors.index.json, as `save_pretrained` writes them) and the tokenizer files found
    in `tokenizer_dir`. Params must be addressable from this process; one shard at a time is
    copied to host memory. With a reward model's `score` [1, d_model]: a
    LlamaForSequenceClassification (its `score.weight` in place of `lm_head.weight`), what
    `AutoModelForSequenceClassification.from_pretrained` loads (TRL's reward model layout)."""
    if dtype not in DTYPES:
        raise bad_choice("dtype", dtype, DTYPES)
    params: dict[str, Any] = {n: (v.get_value() if e is None else v.get_value()[e], t)
                              for n, (v, t, e) in hf_params(model).items()}
    if score is not None:
        params.pop("lm_head.weight", None)
        params["score.weight"] = (score, False)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config(cfg, dtype, **(specials or {}), reward=score is not None), f, indent=2)
    _write_weights(params, out_dir, DTYPES[dtype], shard_bytes)
    for name in TOKENIZER_FILES if tokenizer_dir else ():
        if os.path.exists(os.path.join(tokenizer_dir, name)):
            shutil.copy(os.path.join(tokenizer_dir, name), os.path.join(out_dir, name))


def _write_weights(params: dict[str, tuple[Any, bool]], out_dir: str, dtype: Any, shard_bytes: int) -> None:
    """The tensors (name -> (array, transpose)) as model.safetensors, or as shards of at most
    `shard_bytes` (a larger tensor alone) named as transformers names them, with their index."""
    size = lambda name: math.prod(params[name][0].shape) * np.dtype(dtype).itemsize  # noqa: E731
    shards: list[list[str]] = [[]]
    for name in params:
        if shards[-1] and sum(map(size, shards[-1])) + size(name) > shard_bytes:
            shards.append([])
        shards[-1].append(name)
    files = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    for file, names in zip(files, shards, strict=True):
        tensors = {}
        for name in names:
            arr, transpose = params[name]
            arr = np.asarray(jax.device_get(arr))
            tensors[name] = np.ascontiguousarray((arr.T if transpose else arr).astype(dtype))
        save_file(tensors, os.path.join(out_dir, file), metadata={"format": "pt"})
        del tensors  # this shard's host copy, before the next one's
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(map(size, params))},
                 "weight_map": {name: file for file, names in zip(files, shards, strict=True) for name in names}}
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
