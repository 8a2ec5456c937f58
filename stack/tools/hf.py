"""`python -m stack.tools.hf export RUN/checkpoints --out DIR`: a run's checkpoint as a Hugging Face
Llama directory (config.json, model.safetensors or shards with their index, generation_config.json,
the tokenizer: its files, or for the byte tokenizer a tokenizer.json; a built-in chat template as
chat_template.jinja) that `transformers.AutoModelForCausalLM.from_pretrained(DIR)` loads without
warnings: config.json in the form transformers 5 writes, with the tokenizer's bos/eos/pad ids.
A reward model (algorithm=rm) is written as a LlamaForSequenceClassification with one label, as
TRL's RewardTrainer saves one (`AutoModelForSequenceClassification.from_pretrained(DIR)` scores
as `python -m stack.tools.generate --score` does). A PPO value model's head is written beside the
policy as `value_head.safetensors`: one tensor `score.weight` [1, d_model], the layout of
`LlamaForSequenceClassification.score` (a PPO value model's own trunk is not exported).
A LoRA/QLoRA run is exported with `--merge-adapters` (base + (alpha / rank) A B; a QLoRA base
dequantized). Importing is `model.init_from=hf:DIR` on any run.
"""

import argparse
import json
import os
from typing import Any

import numpy as np

from stack.errors import ConfigError, exit_on
from stack.tools.outdir import check_out, fresh_dir

SCORE = ("score", "kernel")  # a reward model's head [d_model, 1] in its checkpoint (algorithm=rm)
VALUE = ("value", "head", "kernel")  # PPO's value head, written beside the policy as value_head.safetensors


def export(checkpoints: str, out: str, step: int | None = None, dtype: str = "float32",
           merge_adapters: bool = False, overwrite: bool = False, shard_bytes: int = 5 * 10**9) -> int:
    """Write the policy of `checkpoints` (newest step, or `step`) to `out` (a reward model with its
    score head, a PPO value head beside it); return the step. A LoRA/QLoRA run needs `merge_adapters`: its
    checkpoint holds adapters only, exported as W + (alpha / rank) A B (stack.quant.merge); a PTQ
    checkpoint (python -m stack.tools.quantize) exports its dequantized weights. A non-empty `out` is
    replaced only with `overwrite`, and only once the export is complete (stack.tools.outdir)."""
    check_out(out, overwrite)  # before minutes of reading
    with fresh_dir(out, overwrite) as tmp:
        return _write(checkpoints, tmp, step, dtype, merge_adapters, shard_bytes)


def _write(checkpoints: str, out: str, step: int | None, dtype: str, merge_adapters: bool, shard_bytes: int) -> int:
    from stack.checkpoint.policy import float_policy
    from stack.checkpoint.saved_params import read_params
    from stack.models.hf import export_hf  # after argparse: --help and argument errors answer without jax

    if not merge_adapters and read_params(checkpoints, step).adapters_only:
        raise ConfigError(f"{checkpoints!r} holds LoRA/QLoRA adapters only, not a full model: pass --merge-adapters "
                          "to export the base with the adapters merged in (W + alpha/rank * A B).")
    model, cfg, saved = float_policy(checkpoints, step)  # PTQ weights dequantized
    tokenizer = cfg.data.tokenizer
    tokenizer_dir = (None if tokenizer == "byte"
                     else tokenizer if os.path.isdir(tokenizer) else os.path.dirname(tokenizer))
    score = _head(saved.tree, SCORE)
    export_hf(model, cfg.model, out, tokenizer_dir=tokenizer_dir, dtype=dtype, specials=specials(tokenizer),
              score=None if score is None else score.T, shard_bytes=shard_bytes)
    _beside_weights(out, cfg, tokenizer_dir)
    value = _head(saved.tree, VALUE)
    if value is not None:
        from safetensors.numpy import save_file  # after argparse: --help and argument errors answer without jax

        from stack.models.hf import DTYPES

        weight = np.ascontiguousarray(value.T.astype(DTYPES[dtype]))  # HF's score.weight layout [1, d_model]
        save_file({"score.weight": weight}, os.path.join(out, "value_head.safetensors"), metadata={"format": "pt"})
    return saved.step


def _beside_weights(out: str, cfg: Any, tokenizer_dir: str | None) -> None:
    """generation_config.json (every eos id of the tokenizer's model dir, else the tokenizer's one:
    stack.data.tokenizers.stop_ids),
    the byte tokenizer as tokenizer.json, a built-in chat template as chat_template.jinja."""
    from stack.data.tokenizers import make_tokenizer, stop_ids
    from stack.tools.hf_files import chat_jinja, generation_config, write_byte_tokenizer  # tokenizers: export only

    tok = make_tokenizer(cfg.data.tokenizer)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(generation_config(tok.bos_id, list(stop_ids(tok)), tok.pad_id), f, indent=2)
    if cfg.data.tokenizer == "byte":
        write_byte_tokenizer(out, cfg.model.max_seq_len)
    if cfg.data.get("chat_template") not in (None, "tokenizer"):  # the tokenizer's own is in its files
        with open(os.path.join(out, "chat_template.jinja"), "w") as f:
            f.write(chat_jinja(cfg.data.chat_template))


def specials(tokenizer: str) -> dict[str, int]:
    """bos/eos/pad_token_id of the run's tokenizer (`data.tokenizer`), for config.json."""
    from stack.data.tokenizers import make_tokenizer  # after argparse: --help and argument errors answer without jax

    tok = make_tokenizer(tokenizer)
    return {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}


def _head(tree: dict, path: tuple[str, ...]) -> np.ndarray | None:
    """The array at `path` of a saved params tree, or None."""
    for key in path:
        tree = tree.get(key) if isinstance(tree, dict) else None
    return None if tree is None else np.asarray(tree)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stack.tools.hf", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="a run's checkpoint -> a Hugging Face Llama directory")
    ex.add_argument("checkpoints", help="a run's checkpoints dir or the run dir (its config.yaml is read)")
    ex.add_argument("--out", required=True)
    ex.add_argument("--step", type=int, default=None, help="default: the newest complete step")
    ex.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ex.add_argument("--merge-adapters", action="store_true",
                    help="a LoRA/QLoRA run: write the base weights with the adapters merged in")
    ex.add_argument("--overwrite", action="store_true", help="replace a non-empty --out (once the export is done)")
    ex.add_argument("--max-shard-gb", type=float, default=5.0,
                    help="weights above this go into shards of at most it, with model.safetensors.index.json")
    args = parser.parse_args(argv)
    with exit_on(ConfigError):
        step = export(args.checkpoints, args.out, args.step, args.dtype, args.merge_adapters, args.overwrite,
                      int(args.max_shard_gb * 10**9))
    print(f"exported step {step} of {args.checkpoints} to {args.out}")


if __name__ == "__main__":
    main()
