"""Where XLA:CPU runs a step: on its own worker thread (jax's async dispatch) or in the calling
thread, chosen per run from the size of the step's temporaries (`hardware.async_dispatch`).

XLA:CPU allocates a step's temporaries with malloc on the thread that runs the step. With async
dispatch that is a PjRt worker thread, and glibc serves a thread's blocks from its own arena,
whose heaps hold at most 64 MiB: a larger block is mmap'd, page-faulted in and unmapped again
every step, whatever stack.hardware.host_memory keeps; above 64 MiB a step therefore runs faster
in the caller, whose main arena keeps them. Below 64 MiB async dispatch is the better one: it hides
the loop's host work behind the step. jax applies the setting to single-device programs only
(sharded ones stay async), and reads it once, when the process first uses the CPU backend: in a
sweep run by one process (hydra's basic launcher) the first job's choice holds.
"""

from typing import Any

import jax

ARENA_HEAP_BYTES = 64 << 20  # glibc's HEAP_MAX_SIZE on 64-bit: a thread arena's largest heap


def step_temp_bytes(model_cfg: Any, batch_size: int, seq_len: int) -> int:
    """Estimated bytes of temporaries of one float32 training step of a Llama on batch_size × seq_len
    tokens: per token, 10·d_model + 5·d_ff + 3·n_heads·seq_len values per layer plus the vocabulary
    logits, 4 bytes each. Fitted to XLA:CPU's `memory_analysis().temp_size_in_bytes` of SFT steps
    from the tiny to the medium bench config (within about 5 %)."""
    m = model_cfg
    per_token = m.n_layers * (10 * m.d_model + 5 * m.d_ff + 3 * m.n_heads * seq_len) + m.vocab_size
    return 4 * batch_size * seq_len * per_token


def step_rows(cfg: Any) -> tuple[int, int]:
    """(rows, tokens a row) a training step runs the policy on: each prompt's `num_generations`
    completions (GRPO) of its prompt plus `max_new_tokens` (prompt data), else the data's batch:
    counting the batch alone underestimated the GRPO update's temporaries, and llama_grpo then ran
    async, slower than in the caller."""
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
    jax.config.update("jax_cpu_enable_async_dispatch", async_dispatch(cfg))
