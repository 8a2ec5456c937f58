"""What an algorithm gives the generic loop."""

from typing import Any, Protocol

import jax
from flax import nnx

Metrics = dict[str, jax.Array]


class Algorithm(Protocol):
    """An objective. The loop owns the step, accumulation, logging, eval and checkpoints.

    `frozen(model)` returns state the loss reads but never trains (e.g. a DPO reference
    model's params; None for SFT). When `precomputes`, the loop calls the pure
    `columns(model, batch, frozen)` once per record before training (stack.precompute), adds
    its per-row outputs to every later batch, and passes `frozen=None` from then on. `loss` is
    pure and traced inside the jitted step; its metrics are scalars, averaged over the logging
    window (named without the `train/` or `eval/` prefix, which the loop adds).
    """

    data_kinds: tuple[str, ...]  # the `data.kind`s whose batches the loss reads
    precomputes: bool  # whether `columns` runs once before training

    def frozen(self, model: nnx.Module) -> Any: ...

    def batch_tokens(self, batch: dict[str, Any]) -> int:
        """Tokens the model processes per batch (for throughput and MFU)."""
        ...

    def columns(self, model: nnx.Module, batch: dict[str, jax.Array], frozen: Any) -> dict[str, jax.Array]:
        """Per-row values (leading dim = batch) computed once from the initial model and frozen state."""
        ...

    def loss(self, model: nnx.Module, batch: dict[str, jax.Array], frozen: Any) -> tuple[jax.Array, Metrics]: ...
