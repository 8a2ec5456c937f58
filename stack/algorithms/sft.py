"""Supervised fine-tuning: next-token cross-entropy on completion tokens only."""

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from stack.algorithms.base import Metrics


class SFT:
    """Batches carry `inputs`, `targets` and `loss_mask` (1 on completion tokens).

    `loss_reduction="mean"` divides the masked token NLL sum by the number of masked
    tokens in the (micro-)batch; `"sum"` returns the sum.
    """

    data_kinds = ("sft", "text")
    precomputes = False

    def __init__(self, name: str = "sft", loss_reduction: str = "mean"):
        self.name, self.loss_reduction = name, loss_reduction

    def frozen(self, model: nnx.Module) -> None:
        return None

    def batch_tokens(self, batch: dict[str, Any]) -> int:
        return int(batch["inputs"].size)

    def loss(self, model: nnx.Module, batch: dict[str, jax.Array], frozen: Any = None) -> tuple[jax.Array, Metrics]:
        logits = model(batch["inputs"], positions=batch.get("positions"), segment_ids=batch.get("segment_ids"))
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
        mask = batch["loss_mask"].astype(jnp.float32)
        tokens = mask.sum()
        total = (nll * mask).sum()
        loss = total / jnp.maximum(tokens, 1.0) if self.loss_reduction == "mean" else total
        return loss, {"loss_tokens": tokens}
