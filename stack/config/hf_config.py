"""Hugging Face `config.json` <-> the `model` group, without jax (preflight uses it): Llama and the
families of stack.config.hf_families.

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

from stack.config.hf_families import FAMILY_KEYS, architecture, check_family, family_config, family_fields, rope_of
from stack.config.schema.model import ModelConfig
from stack.errors import ConfigError

# ModelConfig field -> config.json key (as named in error messages)
HF_KEYS = {"vocab_size": "vocab_size", "d_model": "hidden_size", "n_layers": "num_hidden_layers",
           "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
           "d_ff": "intermediate_size", "rope_theta": "rope_theta", "rope_scaling": "rope_scaling",
           "norm_eps": "rms_norm_eps", "tie_embeddings": "tie_word_embeddings", **FAMILY_KEYS}
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


def hf_config_to_model(hf: dict, reward: bool = False) -> dict:
    """The ModelConfig fields implied by a HF `config.json` (head_dim None if derived; `reward`: of a
    one-label sequence classifier)."""
    check_family(hf, reward)
    labels = len(hf.get("id2label") or {0: 0, 1: 1})  # transformers' default: 2 labels
    if reward and labels != 1:
        raise ConfigError(f"config.json has {labels} labels (id2label); a reward model scores with one (num_labels=1).")
    try:
        d, heads = hf["hidden_size"], hf["num_attention_heads"]
        out = {"vocab_size": hf["vocab_size"], "d_model": d, "n_layers": hf["num_hidden_layers"],
               "n_heads": heads, "n_kv_heads": hf.get("num_key_value_heads") or heads,
               "d_ff": hf["intermediate_size"]}
    except KeyError as e:
        raise ConfigError(f"config.json has no {e.args[0]!r}, which a Llama config needs.") from None
    scaling = rope_of(hf)  # transformers>=5: theta and scaling in one dict
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ("default", "llama3", "linear"):
        raise ConfigError(f"config.json rope_scaling type {kind!r} is not supported (llama3 or linear).")
    keys = SCALING_KEYS if kind == "llama3" else ("factor",) if kind == "linear" else ()
    head_dim = hf.get("head_dim")
    return {**out, **family_fields(hf), "head_dim": None if head_dim in (None, d // heads) else head_dim,
            "rope_theta": float(hf.get("rope_theta", scaling.get("rope_theta", 10000.0))),
            "rope_scaling": {"type": kind, **{k: scaling[k] for k in keys}},
            "max_seq_len": hf.get("max_position_embeddings", 2048),
            "norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
            "tie_embeddings": bool(hf.get("tie_word_embeddings", False))}


def _ours(cfg: Any) -> dict:
    """`cfg`'s values of the fields in HF_KEYS, head_dim resolved, rope_scaling as a dict."""
    out = {k: getattr(cfg, k, None) for k in HF_KEYS}  # None: a run config written before the key
    out["head_dim"] = cfg.head_dim or cfg.d_model // cfg.n_heads
    for key in ("attention_bias", "qk_norm", "norm_topk_prob"):
        out[key] = bool(out[key])
    out["layer_types"] = None if out["layer_types"] is None else list(out["layer_types"])
    s = cfg.rope_scaling
    kind = "default" if s is None else s.type  # None: a run config written before the typed field
    keys = SCALING_KEYS if kind == "llama3" else ("factor",) if kind == "linear" else ()
    out["rope_scaling"] = {"type": kind, **{k: getattr(s, k) for k in keys}}
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
    scaling = dict(ours["rope_scaling"])
    rope = {"rope_theta": float(ours["rope_theta"]), "rope_type": scaling.pop("type"), **scaling}
    hf = {HF_KEYS[k]: v for k, v in ours.items() if k not in ("rope_theta", "rope_scaling", *FAMILY_KEYS)}
    hf |= {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "attention_bias": ours["attention_bias"], "mlp_bias": False, "attention_dropout": 0.0, "pretraining_tp": 1,
           "use_cache": True, "max_position_embeddings": cfg.max_seq_len, "initializer_range": cfg.init_std,
           "dtype": dtype, "bos_token_id": bos_token_id, "eos_token_id": eos_token_id,
           "pad_token_id": pad_token_id, "rope_parameters": dict(sorted(rope.items())),
           "rope_theta": rope["rope_theta"]}  # also top-level: tools that read only it fell back to 10000
    hf |= family_config(cfg, dict(sorted(rope.items())))
    if reward:
        hf |= {"architectures": [architecture(cfg.family, reward=True)], "id2label": {"0": "LABEL_0"},
               "label2id": {"LABEL_0": 0}}
    return dict(sorted(hf.items()))


