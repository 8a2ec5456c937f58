"""Supervised fine-tuning: next-token cross-entropy on completion tokens only."""

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from stack.algorithms.base import Batch, Context, Metrics, Schedule, Setup, Terms, loss_metrics, real_tokens
from stack.config.schema.algorithm import SFTConfig


class SFT:
    """Batches carry `inputs`, `targets` and `loss_mask` (1 on completion tokens).

    `loss_reduction="mean"`: the masked token NLL summed, divided by the number of masked
    tokens of the whole minibatch (however it is split into micro-batches); `"sum"`: the
    sum per micro-batch, averaged over micro-batches.
    """

    data_kinds = SFTConfig.data_kinds
    schedule = Schedule()
    precomputes = False
    collect = score = scores_spec = finalize = keep = interact = None  # the batch is the experience

    def __init__(self, name: str = "sft", loss_reduction: str = "mean"):
        self.name, self.loss_reduction = name, loss_reduction

    def setup(self, policy: nnx.Module, ctx: Context) -> Setup:
        return Setup()

    def loss(self, models: nnx.Module, batch: Batch, frozen: Any, state: Any, key: jax.Array) -> tuple[Terms, Metrics]:
        logits = models.policy(batch["inputs"], positions=batch.get("positions"), segment_ids=batch.get("segment_ids"))
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
        mask = batch["loss_mask"].astype(jnp.float32)
        tokens = mask.sum()
        den = tokens if self.loss_reduction == "mean" else jnp.ones(())
        return ((nll * mask).sum(), den), {"loss_tokens": tokens, **real_tokens(batch)}

    def evaluate(self, models: nnx.Module, xp: Batch, scores: Any, frozen: Any, state: Any) -> Metrics:
        return loss_metrics(self.loss, models, xp, frozen, state)

    def batch_tokens(self, batch: dict[str, Any]) -> int:
        return int(batch["inputs"].size)
