"""`python -m stack.tools.generate PATH --prompt TEXT`: completions from a stack run's checkpoints
dir or a Hugging Face Llama dir, sampled on device with the KV cache (stack.rollout).

    python -m stack.tools.generate runs/a/checkpoints --prompt "12+7=" --max-new-tokens 8 --temperature 0.7 --top-p 0.9
    python -m stack.tools.generate path/to/hf_llama_dir --prompt "Hello" --greedy
    python -m stack.tools.generate runs/rm/checkpoints --prompt "copy abc=" --score abc --score abd  # a reward model
    python -m stack.tools.generate path/to/hf_reward_model --prompt "copy abc=" --score abc  # TRL RewardTrainer output
    python -m stack.tools.generate runs/chat/checkpoints --chat --prompt "What is 2+3?"   # a user turn, as trained

A checkpoints dir is read with its run's `config.yaml` (model shape, tokenizer); a HF dir
with its `config.json` and, when present, its `tokenizer.json` (else the byte tokenizer).
Prompts are encoded as the data pipeline encodes them: BOS, then the text; with `--chat` each is
one user message rendered with the run's `data.chat_template` (a HF dir: its tokenizer's own) and
an open assistant turn, as GRPO prompts are (HF apply_chat_template, add_generation_prompt=True).
"""

import argparse
import os
from typing import Any

from stack.errors import ConfigError, exit_on


def load(path: str, chat: bool = False):
    """(model, tokenizer, max_seq_len, chat template: (data.chat_template, data.tokenizer) or None)
    of a checkpoints dir or a HF Llama dir; `chat`: a HF dir without tokenizer.json is refused
    before its weights are read."""
    from stack.data.tokenizers import (  # after argparse: --help and argument errors answer without jax
        dir_tokenizer,
        make_tokenizer,
    )

    if os.path.isfile(os.path.join(path, "config.json")):
        from stack.config.hf_config import hf_model_config
        from stack.models.hf import load_hf_weights  # after argparse: --help and argument errors answer without jax
        from stack.models.init import abstract_model

        cfg = hf_model_config(path)
        has_tokenizer = os.path.isfile(os.path.join(path, "tokenizer.json"))
        if chat and not has_tokenizer:
            raise ConfigError(f"--chat: {path!r} has no tokenizer.json, so no chat template to render the "
                              "prompts with; pass each prompt already formatted, without --chat.")
        model = abstract_model(cfg)
        load_hf_weights(model, cfg, path)
        return model, dir_tokenizer(path), cfg.max_seq_len, ("tokenizer", path) if has_tokenizer else None
    from stack.checkpoint.policy import load_policy  # after argparse: --help and argument errors answer without jax
    from stack.checkpoint.saved_params import checkpoints_of

    path = checkpoints_of(path)
    config = os.path.join(os.path.dirname(os.path.abspath(path.rstrip("/"))), "config.yaml")
    if not os.path.isdir(path) or not os.path.isfile(config):
        raise ConfigError(f"{path!r} is neither a Hugging Face Llama dir (with config.json) nor a stack run's "
                          "dir or its checkpoints dir (with the run's config.yaml beside it).")

    model, run, _ = load_policy(path)  # a LoRA run's adapters merged into its base
    return (model, make_tokenizer(run.data.tokenizer), run.model.max_seq_len,
            (run.data.chat_template, run.data.tokenizer))


def encode_prompts(prompts: list[str], tokenizer, template: tuple[str, str] | None, limit: int) -> list[list[int]]:
    """Each prompt's token ids; with a `template` (--chat) a one-message user turn and an open
    assistant turn, encoded as the data pipeline encodes prompt records (stack.data.encode)."""
    if template is None:
        return [[tokenizer.bos_id, *tokenizer.encode(p)] for p in prompts]
    from stack.data.chat import make_template  # after argparse: --help and argument errors answer without jax
    from stack.data.encode import Encoder

    encoder = Encoder("prompt", tokenizer, make_template(*template), limit, "error")
    rows = [encoder.encode({"prompt": [{"role": "user", "content": p}]}, f"--prompt {i + 1}")
            for i, p in enumerate(prompts)]
    return [r["prompt_ids"][r["prompt_mask"] > 0].tolist() for r in rows]


def bad_sampling(args: Any, flags: bool = True) -> list[str]:
    """`--flag=value` (`flags` False: `name=value`) of each sampling setting of `args` out of its range."""
    checks = (("temperature", args.temperature >= 0), ("top_k", args.top_k >= 0), ("top_p", 0 < args.top_p <= 1),
              ("num_samples", args.num_samples >= 1), ("slots", args.slots >= 0), ("page_size", args.page_size >= 1))
    return [f"--{name.replace('_', '-')}={getattr(args, name)}" if flags else f"{name}={getattr(args, name)}"
            for name, ok in checks if not ok]


def sample(model, tokenizer, encoded: list[list[int]], args: Any, limit: int) -> list[list[str]]:
    """`args.num_samples` completions of each encoded prompt (text up to the first EOS)."""
    import jax  # after argparse: --help and argument errors answer without jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from stack.data.tokenizers import stop_ids
    from stack.rollout import Paging, Sampling, generate, sample_keys

    width = max(map(len, encoded))
    if args.max_new_tokens < 1 or width + args.max_new_tokens > limit:
        raise ConfigError(f"--max-new-tokens={args.max_new_tokens} with a {width}-token prompt does not fit: it "
                          f"must be >= 1 and prompt + new tokens <= the model's max_seq_len={limit}.")
    rows = [e for e in encoded for _ in range(args.num_samples)]
    ids = np.array([[tokenizer.pad_id] * (width - len(e)) + e for e in rows], np.int32)
    mask = (np.arange(width)[None] >= width - np.array([len(e) for e in rows])[:, None]).astype(np.int32)
    keys = sample_keys(jax.random.key(args.seed), jnp.repeat(jnp.arange(len(encoded)), args.num_samples),
                       jnp.tile(jnp.arange(args.num_samples), len(encoded)))
    stops = stop_ids(tokenizer)
    paging = Paging(args.slots, args.page_size) if args.engine == "paged" else None
    s = Sampling(args.max_new_tokens, 0.0 if args.greedy else args.temperature, args.top_k, args.top_p, stops,
                 tokenizer.pad_id, paging)
    out = nnx.jit(lambda m, i, k, key: generate(m, i, k, key, s))(model, ids, mask, keys)
    tokens, keep = np.asarray(out.tokens), np.asarray(out.mask) > 0
    texts = [tokenizer.decode(row[m & ~np.isin(row, stops)].tolist()) for row, m in zip(tokens, keep, strict=True)]
    return [texts[i * args.num_samples:(i + 1) * args.num_samples] for i in range(len(encoded))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stack.tools.generate", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a stack run's dir (or its checkpoints dir) or a Hugging Face Llama dir")
    parser.add_argument("--prompt", action="append", required=True, help="repeat for a batch of prompts")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0: off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1.0: off")
    parser.add_argument("--greedy", action="store_true", help="argmax decoding (temperature 0)")
    parser.add_argument("--chat", action="store_true",
                        help="each prompt is a user message in the run's chat template (an open assistant turn)")
    parser.add_argument("--num-samples", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine", choices=("static", "paged"), default="static",
                        help="paged: continuous batching over a paged KV cache (the same samples)")
    parser.add_argument("--slots", type=int, default=0, help="paged: rows decoded together (0: every row)")
    parser.add_argument("--page-size", type=int, default=16, help="paged: tokens per KV page")
    parser.add_argument("--score", action="append", metavar="COMPLETION",
                        help="with a reward model (an algorithm=rm run's checkpoints or a HF "
                             "LlamaForSequenceClassification dir): score this completion of each prompt "
                             "instead of sampling; repeat for several")
    args = parser.parse_args(argv)
    if bad := bad_sampling(args):
        parser.error(f"{', '.join(bad)}: --temperature must be >= 0 (0: greedy), --top-k >= 0 (0: off), --top-p in "
                     "(0, 1] (1.0: off), --num-samples >= 1, --slots >= 0 (0: every row) and --page-size >= 1.")
    with exit_on(ConfigError):
        if args.score:
            from stack.rewards.model import score_texts  # after argparse: --help and argument errors answer without jax

            path = f"hf:{args.path}" if os.path.isfile(os.path.join(args.path, "config.json")) else args.path
            pairs = [(p, c) for p in args.prompt for c in args.score]
            scores = score_texts(path, [p for p, _ in pairs], [c for _, c in pairs])
            for (prompt, completion), score in zip(pairs, scores, strict=True):
                print(f"{score:.4f}\t{prompt}{completion}")
            return
        model, tokenizer, limit, template = load(args.path, args.chat)
        encoded = encode_prompts(args.prompt, tokenizer, template if args.chat else None, limit)
        completions = sample(model, tokenizer, encoded, args, limit)
    for prompt, texts in zip(args.prompt, completions, strict=True):
        for text in texts:
            print(f"{prompt}{text}")


if __name__ == "__main__":
    main()
