"""Hugging Face Llama `config.json` <-> the `model` group, without jax (preflight uses it).

Reads both config styles: transformers<5 (`rope_theta`, `rope_scaling`) and >=5
(`rope_parameters`); writes the current (>=5) one. `take_architecture` is `model=hf`: the
architecture comes from `model.path`'s config.json, and a field set on the command line must
agree with the file.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from omegaconf import DictConfig, OmegaConf

from stack.config.schema.model import ModelConfig
from stack.errors import ConfigError

# ModelConfig field -> config.json key (as named in error messages)
HF_KEYS = {"vocab_size": "vocab_size", "d_model": "hidden_size", "n_layers": "num_hidden_layers",
           "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
           "d_ff": "intermediate_size", "rope_theta": "rope_theta", "rope_scaling": "rope_scaling",
           "norm_eps": "rms_norm_eps", "tie_embeddings": "tie_word_embeddings"}
SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
PARAM_DTYPES = ("float32", "bfloat16", "float16")


def read_config(root: str) -> dict:
    """The parsed `root/config.json` (`root` may carry the `hf:` prefix)."""
    root = root.removeprefix("hf:")
    try:
        with open(os.path.join(root, "config.json")) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the Hugging Face config.json in {root!r}: {e}") from None


def hf_model_config(root: str, reward: bool = False) -> DictConfig:
    """The `model` config of a HF Llama dir (`root` may carry `hf:`): the ModelConfig schema with
    the fields its config.json implies (`reward`: of a LlamaForSequenceClassification)."""
    return OmegaConf.merge(OmegaConf.structured(ModelConfig), hf_config_to_model(read_config(root), reward))


def _check_llama(hf: dict, reward: bool = False) -> None:
    """Reject configs of models other than a bias-free SiLU LlamaForCausalLM (`reward`: a
    LlamaForSequenceClassification with one label, TRL's reward model)."""
    want, use = ("LlamaForSequenceClassification", "as a reward model") if reward else ("LlamaForCausalLM",
                                                                                         "with this model")
    archs = hf.get("architectures") or [want]
    if hf.get("model_type") != "llama" or archs != [want]:
        raise ConfigError(f"config.json describes model_type={hf.get('model_type')!r}, architectures={archs}; "
                          f"only Llama checkpoints (model_type 'llama', {want}) can be used {use}.")
    labels = len(hf.get("id2label") or {0: 0, 1: 1})  # transformers' default: 2 labels
    if reward and labels != 1:
        raise ConfigError(f"config.json has {labels} labels (id2label); a reward model scores with one (num_labels=1).")
    unsupported = {k: hf[k] for k, ok in (("attention_bias", False), ("mlp_bias", False),
                                          ("hidden_act", "silu")) if hf.get(k, ok) != ok}
    if unsupported:
        raise ConfigError(f"config.json sets {unsupported}, which this Llama does not support "
                          "(it has no biases and uses SiLU).")


def hf_config_to_model(hf: dict, reward: bool = False) -> dict:
    """The ModelConfig fields implied by a HF Llama `config.json` (head_dim None if derived;
    `reward`: of a LlamaForSequenceClassification)."""
    _check_llama(hf, reward)
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
            if kind == "llama3" else {"type": "default"},
            "max_seq_len": hf.get("max_position_embeddings", 2048),
            "norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
            "tie_embeddings": bool(hf.get("tie_word_embeddings", False))}


def _ours(cfg: Any) -> dict:
    """`cfg`'s values of the fields in HF_KEYS, head_dim resolved, rope_scaling as a dict."""
    out = {k: getattr(cfg, k) for k in HF_KEYS}
    out["head_dim"] = cfg.head_dim or cfg.d_model // cfg.n_heads
    s = cfg.rope_scaling
    scaled = s is not None and s.type != "default"  # None: a run config written before the typed field
    out["rope_scaling"] = (
        {"type": s.type, **{k: getattr(s, k) for k in SCALING_KEYS}} if scaled else {"type": "default"}
    )
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


def check_config(hf: dict, cfg: Any, where: str = "the Hugging Face checkpoint's config.json",
                 reward: bool = False) -> None:
    """Raise ConfigError with a table of every model.* value that disagrees with `config.json`."""
    theirs = hf_config_to_model(hf, reward)
    theirs["head_dim"] = theirs["head_dim"] or theirs["d_model"] // theirs["n_heads"]
    ours = _ours(cfg)
    bad = [(f"model.{k}", str(ours[k]), f"{HF_KEYS[k]}={theirs[k]}") for k in HF_KEYS if not _same(ours[k], theirs[k])]
    if bad:
        widths = [max(len(row[i]) for row in bad + [("key", "model.*", "config.json")]) for i in range(2)]
        table = "\n".join(f"  {a:<{widths[0]}}  {b:<{widths[1]}}  {c}"
                          for a, b, c in [("key", "model.*", "config.json")] + bad)
        raise ConfigError(f"The model config disagrees with {where}:\n{table}\nSet these model.* keys to the "
                          "checkpoint's values, or drop those overrides (model=hf reads them from the file).")


def take_architecture(cfg: DictConfig, overrides: list[str]) -> None:
    """`model=hf` (`model.path` set): every architecture field not named in `overrides` comes from
    `model.path`'s config.json (param_dtype from its `dtype`); a named one must agree with the file.
    With `data.tokenizer=byte` (the data groups' default) the dir's own tokenizer is used if it has one."""
    m = cfg.get("model")
    if not isinstance(m, DictConfig) or m.get("path") is None:
        return  # not model=hf (or no model group): validate explains what is missing
    explicit = {o.lstrip("+~").split("=")[0].removeprefix("model.").split(".")[0]
                for o in overrides if o.lstrip("+~").startswith("model.")}
    hf = read_config(m.path)
    theirs = hf_config_to_model(hf)
    dtype = hf.get("dtype", hf.get("torch_dtype"))
    theirs["param_dtype"] = dtype if dtype in PARAM_DTYPES else "float32"
    for key, value in theirs.items():
        if key in explicit:
            continue
        for sub, v in value.items() if isinstance(value, dict) else ():  # a typed node: key by key
            m[key][sub] = v
        if not isinstance(value, dict):
            m[key] = value
    check_config(hf, m, where=f"{os.path.join(m.path, 'config.json')}")
    if cfg.data.tokenizer == "byte" and any(os.path.isfile(os.path.join(m.path, f))
                                           for f in ("tokenizer.json", "tokenizer.model")):
        cfg.data.tokenizer = m.path


def hf_config(cfg: Any, dtype: str = "float32", bos_token_id: int | None = None,
              eos_token_id: int | None = None, pad_token_id: int | None = None, reward: bool = False) -> dict:
    """`config.json` of a LlamaForCausalLM equal to the model described by `cfg`, in the form
    transformers 5 writes itself (`LlamaForCausalLM.save_pretrained`): every key it writes, sorted,
    `rope_parameters` holding theta and scaling (and `rope_theta` beside it, as transformers 4 wrote
    it), `dtype`; all but its `transformers_version`.
    `reward`: a LlamaForSequenceClassification with one label (a reward model, as TRL's
    RewardTrainer saves one)."""
    ours = _ours(cfg)
    rope = {"rope_theta": float(ours["rope_theta"]), "rope_type": "default"}
    if ours["rope_scaling"]["type"] == "llama3":
        rope |= {"rope_type": "llama3", **{k: ours["rope_scaling"][k] for k in SCALING_KEYS}}
    hf = {HF_KEYS[k]: v for k, v in ours.items() if k not in ("rope_theta", "rope_scaling")}
    hf |= {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "pretraining_tp": 1,
           "use_cache": True, "max_position_embeddings": cfg.max_seq_len, "initializer_range": cfg.init_std,
           "dtype": dtype, "bos_token_id": bos_token_id, "eos_token_id": eos_token_id,
           "pad_token_id": pad_token_id, "rope_parameters": dict(sorted(rope.items())),
           "rope_theta": rope["rope_theta"]}  # also top-level: tools that read only it fell back to 10000
    if reward:
        hf |= {"architectures": ["LlamaForSequenceClassification"], "id2label": {"0": "LABEL_0"},
               "label2id": {"LABEL_0": 0}}
    return dict(sorted(hf.items()))


