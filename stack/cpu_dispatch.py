"""Where XLA:CPU runs a step: on its own worker thread (jax's async dispatch) or in the calling
thread, chosen per run from the size of the step's temporaries (`hardware.async_dispatch`).

XLA:CPU allocates a step's temporaries with malloc on the thread that runs the step. With async
dispatch that is a PjRt worker thread, and glibc serves a thread's blocks from its own arena,
whose heaps hold at most 64 MiB: a larger block is mmap'd, page-faulted in and unmapped again
every step, whatever stack.host_memory keeps. The medium bench config (d_model 512, 4 layers,
2,048 tokens) had 614 MiB of temporaries: ~165,000 minor faults and 0.3 of the 2 cores in the
kernel per step, 690-700 ms a step against 565-575 ms run in the caller (the main thread's arena
keeps them; interleaved runs, 2 cores). Below 64 MiB async dispatch is the better one: it hides
the loop's host work behind the step (tiny SFT, sync costs 7-10 % of tok/s; a config of 40 MiB:
17.6-18.1 ms async vs 18.4-20.1 ms sync). jax applies the setting to single-device programs only
(sharded ones stay async), and reads it once, when the process first uses the CPU backend: in a
sweep run by one process (hydra's basic launcher) the first job's choice holds.
"""

from typing import Any

ARENA_HEAP_BYTES = 64 << 20  # glibc's HEAP_MAX_SIZE on 64-bit: a thread arena's largest heap


def step_temp_bytes(model_cfg: Any, batch_size: int, seq_len: int) -> int:
    """Estimated bytes of temporaries of one float32 training step of a Llama on batch_size × seq_len
    tokens: per token, 10·d_model + 5·d_ff + 3·n_heads·seq_len values per layer plus the vocabulary
    logits, 4 bytes each. Fitted to XLA:CPU's `memory_analysis().temp_size_in_bytes` of an SFT step
    (MiB, XLA / estimate: tiny 8.2 / 7.8; d_model 256, 4 layers, 1,024 tokens 118.3 / 120.5, the same
    with a vocabulary of 8,192 157 / 151; d_model 128, seq_len 512 301.5 / 293; the bench's medium
    563 / 575)."""
    m = model_cfg
    per_token = m.n_layers * (10 * m.d_model + 5 * m.d_ff + 3 * m.n_heads * seq_len) + m.vocab_size
    return 4 * batch_size * seq_len * per_token


def step_rows(cfg: Any) -> tuple[int, int]:
    """(rows, tokens a row) a training step runs the policy on: each prompt's `num_generations`
    completions (GRPO) of its prompt plus `max_new_tokens` (prompt data), else the data's batch.
    Against XLA:CPU's temporaries of the GRPO update (MiB, XLA / estimate): llama_grpo 369 / 382
    (16 prompts x 8 of 48 + 4 tokens); 4 prompts x 2: 22.7 / 23.9. Counting the batch alone read 43.5
    for the recipe, which then ran async: 22-25k vs 31k tokens/s in the caller (2 cores)."""
    algorithm, data = cfg.algorithm, cfg.data
    extra = algorithm.get("max_new_tokens", 0) if data.kind == "prompt" else 0
    return data.batch_size * algorithm.get("num_generations", 1), data.seq_len + extra


def async_dispatch(cfg: Any) -> bool:
    """`hardware.async_dispatch` when set, else whether the step's temporaries fit a thread arena's heap."""
    setting = cfg.hardware.get("async_dispatch")
    if setting is not None:
        return bool(setting)
    return step_temp_bytes(cfg.model, *step_rows(cfg)) < ARENA_HEAP_BYTES


def configure_cpu_dispatch(cfg: Any) -> None:
    """Set jax's CPU dispatch mode for `cfg` (CPU targets only); call before the first computation."""
    if cfg.hardware.platform != "cpu":
        return
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", async_dispatch(cfg))
