"""Hugging Face Llama interop: `config.json` <-> ModelConfig, safetensors <-> NNX params.

HF's `LlamaForCausalLM` uses the same rotate-half RoPE as `stack.models.llama`, so q/k need
no permutation; torch `Linear.weight` is [out, in], our kernels are [in, out] (transposed).
Reads both config styles: transformers<5 (`rope_theta`, `rope_scaling`) and >=5
(`rope_parameters`); writes the current (>=5) one.
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

from stack.errors import ConfigError, bad_choice

# ModelConfig field -> config.json key (as named in error messages)
HF_KEYS = {"vocab_size": "vocab_size", "d_model": "hidden_size", "n_layers": "num_hidden_layers",
           "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
           "d_ff": "intermediate_size", "rope_theta": "rope_theta", "rope_scaling": "rope_scaling",
           "norm_eps": "rms_norm_eps", "tie_embeddings": "tie_word_embeddings"}
SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _check_llama(hf: dict) -> None:
    """Reject configs of models other than a bias-free SiLU LlamaForCausalLM."""
    archs = hf.get("architectures") or ["LlamaForCausalLM"]
    if hf.get("model_type") != "llama" or archs != ["LlamaForCausalLM"]:
        raise ConfigError(
            f"config.json describes model_type={hf.get('model_type')!r}, architectures={archs}; "
            "only Llama checkpoints (model_type 'llama', LlamaForCausalLM) can be used with this model.")
    unsupported = {k: hf[k] for k, ok in (("attention_bias", False), ("mlp_bias", False),
                                          ("hidden_act", "silu")) if hf.get(k, ok) != ok}
    if unsupported:
        raise ConfigError(f"config.json sets {unsupported}, which this Llama does not support "
                          "(it has no biases and uses SiLU).")


def hf_config_to_model(hf: dict) -> dict:
    """The ModelConfig fields implied by a HF Llama `config.json` (head_dim None if derived)."""
    _check_llama(hf)
    try:
        d, heads = hf["hidden_size"], hf["num_attention_heads"]
        out = {"vocab_size": hf["vocab_size"], "d_model": d, "n_layers": hf["num_hidden_layers"],
               "n_heads": heads, "n_kv_heads": hf.get("num_key_value_heads") or heads,
               "d_ff": hf["intermediate_size"]}
    except KeyError as e:
        raise ConfigError(f"config.json has no {e.args[0]!r}, which a Llama config needs.") from None
    rope = hf.get("rope_parameters") or {}  # transformers>=5: theta and scaling in one dict
    scaling = hf.get("rope_scaling") or rope
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ("default", "llama3"):
        raise ConfigError(f"config.json rope_scaling type {kind!r} is not supported (only 'llama3').")
    head_dim = hf.get("head_dim")
    return {**out, "head_dim": None if head_dim in (None, d // heads) else head_dim,
            "rope_theta": float(hf.get("rope_theta", rope.get("rope_theta", 10000.0))),
            "rope_scaling": {"type": "llama3", **{k: scaling[k] for k in SCALING_KEYS}}
            if kind == "llama3" else None,
            "max_seq_len": hf.get("max_position_embeddings", 2048),
            "norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
            "tie_embeddings": bool(hf.get("tie_word_embeddings", False))}


def _ours(cfg: Any) -> dict:
    """`cfg`'s values of the fields in HF_KEYS, head_dim resolved, rope_scaling as a dict."""
    out = {k: getattr(cfg, k) for k in HF_KEYS}
    out["head_dim"] = cfg.head_dim or cfg.d_model // cfg.n_heads
    s = cfg.rope_scaling
    out["rope_scaling"] = None if s is None else {"type": s.type, **{k: getattr(s, k) for k in SCALING_KEYS}}
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


def check_config(hf: dict, cfg: Any) -> None:
    """Raise ConfigError listing every model.* value that disagrees with `config.json`."""
    theirs = hf_config_to_model(hf)
    theirs["head_dim"] = theirs["head_dim"] or theirs["d_model"] // theirs["n_heads"]
    ours = _ours(cfg)
    bad = [f"model.{k}={ours[k]} vs config.json {HF_KEYS[k]}={theirs[k]}"
           for k in HF_KEYS if not _same(ours[k], theirs[k])]
    if bad:
        raise ConfigError("The Hugging Face checkpoint's config.json does not match the model "
                          f"config: {'; '.join(bad)}. Set these model.* keys to the checkpoint's values.")


def _hf_name(path: tuple) -> str:
    """HF tensor name of the param at NNX state `path` (e.g. ('layers', 0, 'attn', 'q_proj', 'kernel'))."""
    if path[0] != "layers":
        return {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight",
                "lm_head": "lm_head.weight"}[path[0]]
    i, part = path[1], path[2]
    if part in ("attn_norm", "mlp_norm"):
        return f"model.layers.{i}.{'input' if part == 'attn_norm' else 'post_attention'}_layernorm.weight"
    return f"model.layers.{i}.{'self_attn' if part == 'attn' else 'mlp'}.{path[3]}.weight"


def _params(model: nnx.Module) -> dict[str, tuple[nnx.Variable, bool]]:
    """HF name -> (our Param variable, whether the HF tensor is its transpose)."""
    return {_hf_name(p): (v, p[-1] == "kernel") for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


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


def _check_tensors(root: str, cfg: Any, params: dict, files: dict[str, str]) -> dict[str, list[str]]:
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
                shape = tuple(params[name][0].get_value().shape)
                want, got = shape[::-1] if params[name][1] else shape, tuple(f.get_slice(name).get_shape())
                if got != want:
                    bad.append(f"{name}: expected {want}, got {got}")
    if bad:
        raise ConfigError(f"wrong tensor shapes in the checkpoint in {root!r}: {'; '.join(bad)}.")
    return by_file


def load_hf_weights(model: nnx.Module, cfg: Any, path: str) -> None:
    """Load a HF Llama checkpoint (`hf:DIR` or `DIR`) into `model` in place.

    Reads `config.json` (checked against `cfg`) and `model.safetensors` or the shards of
    `model.safetensors.index.json`. All names and shapes are checked before anything is
    written; each param keeps its dtype and sharding (an abstract model works too).
    """
    root = path.removeprefix("hf:")
    try:
        with open(os.path.join(root, "config.json")) as f:
            hf = json.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read the Hugging Face config.json in {root!r}: {e}") from None
    check_config(hf, cfg)
    params = _params(model)
    try:
        for file, names in _check_tensors(root, cfg, params, _tensor_files(root)).items():
            with safe_open(file, framework="numpy") as f:  # bf16 comes as ml_dtypes.bfloat16
                for name in names:
                    var, transpose = params[name]
                    old, arr = var.get_value(), f.get_tensor(name)
                    arr = (arr.T if transpose else arr).astype(old.dtype)
                    var.set_value(jax.make_array_from_callback(arr.shape, _sharding(old), lambda i: arr[i]))
    except SafetensorError as e:
        raise ConfigError(f"the safetensors weights in {root!r} cannot be read ({e}): the files are corrupt or "
                          "truncated; re-download or re-export them.") from None


def hf_config(cfg: Any, dtype: str = "float32", bos_token_id: int | None = None,
              eos_token_id: int | None = None, pad_token_id: int | None = None) -> dict:
    """`config.json` of a LlamaForCausalLM equal to the model described by `cfg`, in the form
    transformers 5 writes itself (`LlamaForCausalLM.save_pretrained`): every key it writes, sorted,
    `rope_parameters` holding theta and scaling, `dtype`; all but its `transformers_version`."""
    ours = _ours(cfg)
    rope = {"rope_theta": float(ours["rope_theta"]), "rope_type": "default"}
    if ours["rope_scaling"] is not None:
        rope |= {"rope_type": "llama3", **{k: ours["rope_scaling"][k] for k in SCALING_KEYS}}
    hf = {HF_KEYS[k]: v for k, v in ours.items() if k not in ("rope_theta", "rope_scaling")}
    hf |= {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "pretraining_tp": 1,
           "use_cache": True, "max_position_embeddings": cfg.max_seq_len, "initializer_range": cfg.init_std,
           "dtype": dtype, "bos_token_id": bos_token_id, "eos_token_id": eos_token_id,
           "pad_token_id": pad_token_id, "rope_parameters": dict(sorted(rope.items()))}
    return dict(sorted(hf.items()))


def export_hf(model: nnx.Module, cfg: Any, out_dir: str, tokenizer_dir: str | None = None,
              dtype: str = "float32", specials: dict[str, int | None] | None = None) -> None:
    """Write `model` as a HF LlamaForCausalLM: config.json (`specials`: bos/eos/pad_token_id),
    model.safetensors (in `dtype`) and the tokenizer files found in `tokenizer_dir`. Params must be
    addressable from this process."""
    if dtype not in DTYPES:
        raise bad_choice("dtype", dtype, DTYPES)
    tensors = {}
    for name, (var, transpose) in _params(model).items():
        arr = np.asarray(jax.device_get(var.get_value()))
        tensors[name] = np.ascontiguousarray((arr.T if transpose else arr).astype(DTYPES[dtype]))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config(cfg, dtype, **(specials or {})), f, indent=2)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES if tokenizer_dir else ():
        if os.path.exists(os.path.join(tokenizer_dir, name)):
            shutil.copy(os.path.join(tokenizer_dir, name), os.path.join(out_dir, name))
