"""stack.hardware.cpu_dispatch: the step-temporaries estimate against XLA's own memory analysis, the rule
that picks the dispatch mode from it, and the jax setting it makes."""

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from stack.hardware.cpu_dispatch import (
    ARENA_HEAP_BYTES,
    async_dispatch,
    configure_cpu_dispatch,
    step_rows,
    step_temp_bytes,
)
from stack.models.init import init_model
from tests.helpers import make_cfg

MEDIUM = ["model.d_model=512", "model.n_layers=4", "model.n_heads=8", "model.n_kv_heads=4", "model.d_ff=1408",
          "data.seq_len=256", "data.batch_size=8"]  # bench/step_overhead.py's medium
MID = ["model.d_model=128", "model.n_layers=2", "model.d_ff=352", "data.seq_len=128", "data.batch_size=8"]


def xla_temp_bytes(cfg) -> int:
    """Temporaries of a compiled float32 SFT step (cross-entropy, AdamW) on cfg's batch, per XLA:CPU."""
    model = init_model(cfg.model, 0)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.adamw(1e-3)
    tokens = jnp.zeros((cfg.data.batch_size, cfg.data.seq_len), jnp.int32)

    def step(params, opt_state):
        def loss(p):
            logits = nnx.merge(graphdef, p, rest)(tokens)
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()

        grads = jax.grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    compiled = jax.jit(step).lower(params, tx.init(params)).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("overrides", [[], MID])
def test_the_estimate_is_within_a_fifth_of_xla(overrides):
    cfg = make_cfg(overrides)
    want = xla_temp_bytes(cfg)
    got = step_temp_bytes(cfg.model, cfg.data.batch_size, cfg.data.seq_len)
    assert abs(got - want) <= 0.2 * want, (got, want)


def test_a_grpo_step_counts_each_prompts_completions_within_a_fifth_of_xla():
    """The update of GRPO runs on prompts x num_generations rows of prompt + max_new_tokens tokens."""
    from stack.engine.aot import abstract_run, lower_update, program_report
    from stack.run.build import build

    cfg = make_cfg(["+recipe=llama_grpo", "algorithm.num_generations=2", "data.batch_size=4"])
    exp = build(cfg, run_dir="", abstract=True)
    want = program_report(lower_update(exp, abstract_run(exp))).temp_bytes
    assert step_rows(cfg) == (8, cfg.data.seq_len + cfg.algorithm.max_new_tokens)
    got = step_temp_bytes(cfg.model, *step_rows(cfg))
    assert abs(got - want) <= 0.2 * want, (got, want)
    recipe = make_cfg(["+recipe=llama_grpo"])  # 16 prompts x 8: 369 MiB per XLA
    assert async_dispatch(recipe) is False


def test_small_steps_dispatch_async_and_large_ones_in_the_caller():
    tiny, medium = make_cfg(), make_cfg(MEDIUM)
    assert step_temp_bytes(tiny.model, tiny.data.batch_size, tiny.data.seq_len) < ARENA_HEAP_BYTES
    assert async_dispatch(tiny) is True
    assert async_dispatch(medium) is False  # 575 MiB estimated (XLA: 563)
    assert async_dispatch(make_cfg(MEDIUM + ["hardware.async_dispatch=true"])) is True
    assert async_dispatch(make_cfg(["hardware.async_dispatch=false"])) is False


def test_configure_sets_jax_on_cpu_only():
    before = jax.config.read("jax_cpu_enable_async_dispatch")
    try:
        configure_cpu_dispatch(make_cfg(MEDIUM))
        assert jax.config.read("jax_cpu_enable_async_dispatch") is False
        configure_cpu_dispatch(make_cfg(MEDIUM + ["hardware=gpu_h100"]))  # not a CPU target: untouched
        assert jax.config.read("jax_cpu_enable_async_dispatch") is False
        configure_cpu_dispatch(make_cfg())
        assert jax.config.read("jax_cpu_enable_async_dispatch") is True
    finally:
        jax.config.update("jax_cpu_enable_async_dispatch", before)


def test_a_training_run_sets_it_from_its_config(tmp_path):
    """stack.run.modes.run applies the run's choice before it builds anything (here forced to false)."""
    from stack.run.modes import run

    before = jax.config.read("jax_cpu_enable_async_dispatch")
    try:
        run(make_cfg(["trainer.steps=2", "trainer.eval_every=0", "hardware.async_dispatch=false",
                      f"run_dir={tmp_path}"]))
        assert jax.config.read("jax_cpu_enable_async_dispatch") is False
    finally:
        jax.config.update("jax_cpu_enable_async_dispatch", before)
