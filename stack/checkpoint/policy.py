"""A stack run's trained policy, read back from its checkpoints dir as a plain float Llama
(for export, generation and a reward model), or, for a `python -m stack.tools.quantize` output, as
the PTQ model (quantized weights; `finalize` of its provider dequantizes them for export).

The run's `config.yaml` beside the checkpoints dir gives the model shape and the
quantization. A full checkpoint's policy params are loaded as saved (QAT's are the float
weights); an adapters-only (LoRA/QLoRA) checkpoint gets its base rebuilt as the run built it
(`seed` / `model.init_from`), its adapters loaded, and `finalize` merges them into the base.
"""

import os
from typing import Any

from flax import nnx
from omegaconf import DictConfig

from stack.checkpoint.saved_params import assign_params, checkpoints_of, load_params, read_params, read_run_config
from stack.config.attention import attention_kernel
from stack.errors import ConfigError
from stack.models.hf import load_hf_weights
from stack.models.init import abstract_model, init_model
from stack.models.llama import unfuse, use_attention
from stack.models.moe import use_experts
from stack.quant.providers import make_quantization


def initial_model(cfg: DictConfig, abstract: bool = False) -> nnx.Module:
    """The model to train: random (`seed`), `model.init_from=hf:DIR` (a local HF Llama), or
    `model.init_from=RUN/checkpoints` (the params of another run's newest step)."""
    source = cfg.model.init_from
    if abstract or (source and source.startswith("hf:")):
        model = abstract_model(cfg.model)
        if not abstract:
            load_hf_weights(model, cfg.model, source)  # config.json shapes checked first
    else:
        model = init_model(cfg.model, cfg.seed)
        if source:
            load_params(model, source)
    platform = cfg.hardware.platform  # on CPU a Pallas kernel runs in interpret mode (tests)
    use_attention(model, attention_kernel(cfg.model, platform), cfg.model.get("attention_block"), platform == "cpu")
    use_experts(model, "megablox" if platform == "tpu" else "ragged")  # stack.models.moe: libtpu's ragged dot
    # CPU speedups (the docstrings of MLP and Attention); elsewhere each projection is its own product
    return model if cfg.hardware.platform == "cpu" else unfuse(model)


def run_config(checkpoints: str, key: str = "") -> DictConfig:
    """The resolved config of the run that wrote `checkpoints` (its `config.yaml`); `key` names
    the setting that gave the path, for the error."""
    checkpoints = checkpoints_of(checkpoints)
    path = os.path.join(os.path.dirname(os.path.abspath(checkpoints.rstrip("/"))), "config.yaml")
    if not os.path.isfile(path):
        raise ConfigError(f"{key}{checkpoints!r}: no run config.yaml beside it (expected the checkpoints dir of a "
                          "stack run, RUN/checkpoints, with RUN/config.yaml; for a reward model: of a "
                          "`python -m stack algorithm=rm ...` run).")
    return read_run_config(path)


def load_policy(checkpoints: str, step: int | None = None) -> tuple[nnx.Module, DictConfig, Any]:
    """(the policy as a plain float Llama or a PTQ model, the run's config, the `Saved` step read)."""
    cfg = run_config(checkpoints)
    saved = read_params(checkpoints, step)
    where = f"{checkpoints}/{saved.step}"
    model = init_model(cfg.model, 0)
    quant = make_quantization(cfg.quantization, cfg.seed)
    if not saved.adapters_only:
        model = quant.apply(model) if saved.quantized else model  # PTQ: the quantized structure
        assign_params(model, saved.tree["policy"], where)
        return model, cfg, saved
    adapted = quant.apply(initial_model(cfg))  # the base as the run built it, adapters added
    assign_params(adapted, saved.tree["policy"], where, which=quant.trainable)
    assign_params(model, quant.finalize(adapted), where)
    return model, cfg, saved


def float_policy(checkpoints: str, step: int | None = None) -> tuple[nnx.Module, DictConfig, Any]:
    """`load_policy`, with a PTQ model's weights dequantized into a plain float Llama (for export)."""
    model, cfg, saved = load_policy(checkpoints, step)
    if not saved.quantized:
        return model, cfg, saved
    plain = init_model(cfg.model, 0)
    assign_params(plain, make_quantization(cfg.quantization, cfg.seed).finalize(model), f"{checkpoints}/{saved.step}")
    return plain, cfg, saved
