"""`python -m stack.tools.quantize RUN/checkpoints quantization=w8a8_ptq --out DIR`: post-training
quantization (Qwix PTQ, stack.quant.ptq) of a trained run, with a report of what it costs.

    python -m stack.tools.quantize runs/a/checkpoints quantization=w8_ptq --out runs/a/w8
    python -m stack.tools.quantize runs/a/checkpoints quantization=w8a8_ptq --out runs/a/w8a8 --calibration-batches 16
    python -m stack.tools.quantize runs/a/checkpoints quantization=w4_ptq quantization.rules.0.tile_size=16 --out D
    python -m stack.tools.generate runs/a/w8a8/checkpoints --prompt "12+7=" --greedy  # samples from the quantized model

The run's `config.yaml` is the starting point; overrides replace a group (`data=jsonl_sft`) or
a key (`data.path=...`). Activation scales are calibrated on `quantization.calibration_batches`
batches of the data's train split; the report compares float and quantized on
`trainer.eval_batches` batches of its eval split (eval loss of each, top-1 agreement, mean
|Δ logit|, weight bytes) and is printed and written to DIR/ptq_report.json. DIR/checkpoints
holds the quantized checkpoint (Orbax, one step: the run's), DIR/config.yaml its config.
"""

import argparse
import json
import os
from typing import Any

from hydra import compose, initialize_config_module
from omegaconf import DictConfig, OmegaConf, open_dict

from stack.config.compose_errors import friendly_error
from stack.config.quantization import check_config, is_post_training
from stack.config.schema import CONFIG_MODULE
from stack.errors import ConfigError, DataError, exit_on
from stack.tools.outdir import check_out, fresh_dir

PTQ_OPTIONS = "w8_ptq, w8a8_ptq, w4_ptq, nf4_ptq"
MEASURED_KINDS = ("text", "sft", "preference")  # data kinds with target tokens to compare on


def ptq_config(run: DictConfig, overrides: list[str]) -> DictConfig:
    """The run's config with the overrides: `group=option` replaces the group, `a.b=v` a key."""
    try:
        with initialize_config_module(CONFIG_MODULE, version_base=None):
            fresh = compose(config_name="config", overrides=overrides)
    except Exception as exc:
        raise friendly_error(exc, overrides) from exc
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o]
    groups = {k for k in keys if "." not in k}
    cfg = OmegaConf.create(OmegaConf.to_container(run, resolve=True))
    with open_dict(cfg):
        for key in keys:
            if key.split(".")[0] in groups and key not in groups:
                continue  # inside a group taken whole from the command line
            OmegaConf.update(cfg, key, OmegaConf.to_container(fresh, resolve=True)[key] if key in groups
                             else OmegaConf.select(fresh, key), force_add=True)
        cfg.data.share_prompt, cfg.data.max_completion_len = False, None  # DPO's layouts: PTQ reads whole rows
    check_config(cfg.quantization)
    if not is_post_training(cfg.quantization):
        raise ConfigError(f"quantization={cfg.quantization.name} is not post-training quantization: name one of "
                          f"{PTQ_OPTIONS} (e.g. `python -m stack.tools.quantize RUN/checkpoints quantization=w8_ptq "
                          "--out DIR`).")
    if cfg.data.kind not in MEASURED_KINDS:
        raise ConfigError(f"data.kind={cfg.data.kind!r} ({cfg.data.name}) has no target tokens to calibrate and "
                          f"measure on; pass a data option of kind {', '.join(MEASURED_KINDS)}, e.g. data=synthetic "
                          "or data=jsonl_sft data.path=...")
    return cfg


def _batches(cfg: DictConfig, split: str, n: int) -> list[dict[str, Any]]:
    from stack.data.pipeline import Batches  # after argparse: --help and argument errors answer without jax
    from stack.data.tokenizers import make_tokenizer

    batches = Batches(cfg.data, make_tokenizer(cfg.data.tokenizer), split, cfg.seed + 1, cfg.data.batch_size).take(n)
    if not batches:
        raise DataError(f"The {split} split of data.path={cfg.data.path!r} holds fewer than "
                        f"data.batch_size={cfg.data.batch_size} records.")
    return batches


def quantize_run(checkpoints: str, overrides: list[str], out: str, step: int | None = None,
                 overwrite: bool = False) -> dict[str, Any]:
    """Quantize the policy of `checkpoints`, write DIR/checkpoints, config.yaml, ptq_report.json (a
    non-empty DIR replaced only with `overwrite`, once complete: stack.tools.outdir); the report."""
    from stack.checkpoint.policy import load_policy  # after argparse: --help and argument errors answer without jax
    from stack.quant import ptq

    check_out(out, overwrite)
    model, run, saved = load_policy(checkpoints, step)
    if saved.quantized:
        raise ConfigError(f"{checkpoints!r} is already post-training quantized; quantize the float run's checkpoints.")
    cfg = ptq_config(run, overrides)
    rules = tuple(cfg.quantization.rules)
    from stack.quant.rules import check_against_model  # after argparse: --help and argument errors answer without jax

    check_against_model(rules, model)
    quantized = ptq.quantize(model, rules, _batches(cfg, "train", cfg.quantization.calibration_batches))
    report = {"checkpoints": os.path.abspath(checkpoints), "step": saved.step, "quantization": cfg.quantization.name,
              "calibration_batches": cfg.quantization.calibration_batches,
              **ptq.compare(model, quantized, _batches(cfg, "eval", cfg.trainer.eval_batches)),
              "weight_bytes_float": ptq.weight_bytes(model), "weight_bytes_quantized": ptq.weight_bytes(quantized),
              "activation_scales": ptq.activation_scales(quantized)}
    with fresh_dir(out, overwrite) as tmp:
        write_checkpoint(tmp, cfg, quantized, saved.step, report)
    return report


def write_checkpoint(out: str, cfg: DictConfig, model: Any, step: int, report: dict[str, Any]) -> None:
    """The quantized checkpoint (the training checkpoints' format, params only) and its config.
    NF4 codes (uint4, which TensorStore cannot store) are written as uint8; reading casts back."""
    import jax  # after argparse: --help and argument errors answer without jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    from stack.checkpoint.manager import FORMAT, math_config
    from stack.quant.merge import plain_params

    os.makedirs(out, exist_ok=True)
    OmegaConf.save(cfg, os.path.join(out, "config.yaml"))
    meta = {"step": step, "format": FORMAT, "config": math_config(cfg),
            "resolved_config": OmegaConf.to_container(cfg, resolve=True), "ptq_report": report}
    params = jax.tree.map(lambda x: x.astype(jnp.uint8) if x.dtype == jnp.uint4 else x, plain_params(model))
    manager = ocp.CheckpointManager(os.path.abspath(os.path.join(out, "checkpoints")))
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave({"params": {"policy": params}}),
                                               meta=ocp.args.JsonSave(meta)))
    manager.wait_until_finished()
    manager.close()
    with open(os.path.join(out, "ptq_report.json"), "w") as f:
        json.dump(report, f, indent=1)


def format_report(r: dict[str, Any]) -> str:
    """The report as a few aligned lines."""
    ratio = r["weight_bytes_quantized"] / r["weight_bytes_float"]
    return "\n".join([
        f"{r['quantization']} of {r['checkpoints']} step {r['step']} ({r['eval_tokens']} eval tokens)",
        f"  eval loss        float {r['eval_loss_float']:.4f}   quantized {r['eval_loss_quantized']:.4f}",
        f"  top-1 agreement  {r['top1_agreement']:.4f}   mean |delta logit| {r['mean_abs_logit_delta']:.4g}",
        f"  weight bytes     float {r['weight_bytes_float']:,}   "
        f"quantized {r['weight_bytes_quantized']:,} ({ratio:.3f}x)",
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stack.tools.quantize", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", help="a run's checkpoints dir or run dir (float; LoRA: adapters merged first)")
    parser.add_argument("overrides", nargs="*", help=f"quantization=<{PTQ_OPTIONS}>, data=..., key=value")
    parser.add_argument("--out", required=True, help="new directory for the quantized checkpoint and the report")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out (once the new one is done)")
    parser.add_argument("--calibration-batches", type=int, default=None,
                        help="= quantization.calibration_batches (activation scales; default 8)")
    args = parser.parse_args(argv)
    overrides = args.overrides + ([f"quantization.calibration_batches={args.calibration_batches}"]
                                  if args.calibration_batches is not None else [])
    with exit_on(ConfigError, DataError):
        report = quantize_run(args.checkpoints, overrides, args.out, args.step, args.overwrite)
    print(format_report(report))
    print(f"wrote {args.out}/checkpoints/{report['step']}, {args.out}/ptq_report.json")


if __name__ == "__main__":
    main()
