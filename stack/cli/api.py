"""stack's Python API, for notebooks and scripts: the same composition, checks and code paths as
`python -m stack` and the tools, returning objects instead of printing (`import stack` exposes
these lazily: no jax is imported until one is called).

    import stack
    cfg = stack.compose(["+recipe=llama_sft", "trainer.steps=60"])   # or stack.load_recipe("llama_sft")
    summary = stack.train(cfg, run_dir="runs/a")                    # a Summary: status, metrics, run_dir
    stack.generate("runs/a", ["12+7="], greedy=True)                # [[text]]: completions per prompt
    stack.export_hf("runs/a", "runs/a/hf")                          # a Hugging Face Llama dir; the step

Bad input raises `stack.errors.ConfigError` with the paragraph the command line prints.
"""

import copy
import logging
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from omegaconf import DictConfig, open_dict

from stack.cli.app import preflight
from stack.config.jax_env import set_jax_env
from stack.config.pre_run import check_before_run
from stack.errors import ConfigError
from stack.tools.generate import bad_sampling, encode_prompts, load, sample
from stack.tools.hf import export


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """The validated config of `python -m stack OVERRIDES` (one job: no `-m` sweep). Hydra's logging
    set-up for a run (the root logger at INFO, its console handler) is undone: in a notebook it
    printed every library's INFO lines from then on."""
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    try:
        cfg = preflight(list(overrides))
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers
    if cfg is None:
        raise ConfigError(f"{list(overrides)} composes no run (--help, --info and the like are for the command line).")
    return cfg


def load_recipe(name: str, overrides: Sequence[str] = ()) -> DictConfig:
    """`compose(["+recipe=NAME", *overrides])`: a recipe of recipes/ as a config to change and train."""
    return compose([f"+recipe={name}", *overrides])


def train(cfg: DictConfig, run_dir: str | None = None) -> Any:
    """Train `cfg` in this process in `run_dir` (else `cfg.run_dir`), resuming what is there as the
    command line does; the run's stack.engine.summary.Summary. A NaN stop is a Summary with status
    `stopped_nonfinite`, a preemption (SIGTERM) one with status `preempted`."""
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.run_dir = run_dir or cfg.run_dir
    if not cfg.run_dir:
        raise ConfigError("stack.train needs a run dir: stack.train(cfg, run_dir='runs/a') (or run_dir= in the "
                          "overrides); the command line's default outputs/DATE/TIME is Hydra's.")
    if cfg.mode != "train":
        raise ConfigError(f"'mode'={cfg.mode!r}: stack.train trains (mode=train); use the command line for "
                          "mode=validate and mode=compile.")
    set_jax_env(cfg)
    check_before_run(cfg)
    from stack.run.modes import prepare, train_run  # jax: imported when a run starts, as on the command line

    prepare(cfg)
    return train_run(cfg)


def generate(path: str, prompts: Sequence[str], max_new_tokens: int = 32, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, greedy: bool = False, num_samples: int = 1, seed: int = 0,
             chat: bool = False, engine: str = "static", slots: int = 0, page_size: int = 16) -> list[list[str]]:
    """`num_samples` completions of each prompt from a run's (or its checkpoints') dir or a HF Llama dir,
    as `python -m stack.tools.generate` samples them (text up to the first EOS); `engine` paged:
    continuous batching over a paged KV cache (`slots` rows at once, 0: all), the same samples."""
    args = SimpleNamespace(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                           greedy=greedy, num_samples=num_samples, seed=seed, engine=engine, slots=slots,
                           page_size=page_size)
    if bad := bad_sampling(args, flags=False):
        raise ConfigError(f"{', '.join(bad)}: temperature must be >= 0 (0: greedy), top_k >= 0 (0: off), top_p in "
                          "(0, 1] (1.0: off), num_samples >= 1, slots >= 0 (0: all) and page_size >= 1.")
    model, tokenizer, limit, template = load(path, chat)
    return sample(model, tokenizer, encode_prompts(list(prompts), tokenizer, template if chat else None, limit),
                  args, limit)


def export_hf(run: str, out: str, step: int | None = None, dtype: str = "float32", merge_adapters: bool = False,
              overwrite: bool = False) -> int:
    """A run's policy as a Hugging Face Llama dir in `out` (`python -m stack.tools.hf export`); the step."""
    return export(run, out, step, dtype, merge_adapters, overwrite)
