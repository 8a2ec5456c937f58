"""`python -m stack.hf export RUN/checkpoints --out DIR`: a run's checkpoint as a Hugging Face
Llama directory (config.json, model.safetensors, and the tokenizer files if the run used a
local tokenizer) that `transformers.LlamaForCausalLM.from_pretrained(DIR)` loads.
Importing is `model.init_from=hf:DIR` on any run.
"""

import argparse
import os
import sys

from omegaconf import OmegaConf

from stack.errors import ConfigError


def export(checkpoints: str, out: str, step: int | None = None, dtype: str = "float32") -> int:
    """Write the params of `checkpoints` (newest step, or `step`) to `out`; return the step."""
    from stack.checkpoint import load_params
    from stack.models.hf import export_hf
    from stack.models.llama import init_model

    run_dir = os.path.dirname(os.path.abspath(checkpoints.rstrip("/")))
    cfg = OmegaConf.load(os.path.join(run_dir, "config.yaml"))  # the resolved config of the run
    model = init_model(cfg.model, 0)
    step = load_params(model, checkpoints, step)
    tokenizer = cfg.data.tokenizer
    tokenizer_dir = None if tokenizer == "byte" else tokenizer if os.path.isdir(tokenizer) else os.path.dirname(tokenizer)
    export_hf(model, cfg.model, out, tokenizer_dir=tokenizer_dir, dtype=dtype)
    return step


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stack.hf", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="a run's checkpoint -> a Hugging Face Llama directory")
    ex.add_argument("checkpoints", help="a run's checkpoints dir (its config.yaml is read from the run dir)")
    ex.add_argument("--out", required=True)
    ex.add_argument("--step", type=int, default=None, help="default: the newest complete step")
    ex.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args(argv)
    try:
        step = export(args.checkpoints, args.out, args.step, args.dtype)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    print(f"exported step {step} of {args.checkpoints} to {args.out}")


if __name__ == "__main__":
    main()
