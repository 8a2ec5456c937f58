"""An algorithm's loss with a mixture-of-experts policy's load-balancing loss beside it."""

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from stack.algorithms.base import Batch, Metrics
from stack.models.moe import moe_layers, record_router, router_aux_loss


def routed_loss(alg: Any, coef: float | None, models: nnx.Module, batch: Batch, frozen: Any, state: Any,
                key: jax.Array) -> tuple[Any, Metrics]:
    """`alg.loss`, and with a mixture-of-experts policy its load-balancing loss (stack.models.moe), logged
    as `router_aux_loss` and with `coef` (model.router_aux_loss_coef) one more term, coef · aux over 1
    (transformers' MoE causal LMs: loss + router_aux_loss_coef · aux_loss)."""
    if not moe_layers(models.policy):
        return alg.loss(models, batch, frozen, state, key)
    record_router(models.policy)
    (num, den), metrics = alg.loss(models, batch, frozen, state, key)
    aux = router_aux_loss(models.policy)
    metrics = {**metrics, "router_aux_loss": jax.lax.stop_gradient(aux)}
    if not coef:
        return (num, den), metrics
    return (jnp.append(num, coef * aux), jnp.append(den, 1.0)), metrics
