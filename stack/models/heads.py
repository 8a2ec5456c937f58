"""Scalar heads on a Llama trunk: a reward model's score and a value model's value.

`ScalarHead` maps the trunk's final-normed hidden states (`Llama(..., features=True)`) to one
number per position, like HF's `LlamaForSequenceClassification.score` (a bias-free
`Linear(d_model, 1)`; exported as `score.weight` [1, d_model]). Its kernel starts from
N(0, 1/(d_model+1)) as OpenRLHF's value head. `Critic` is a value model: a head on its own
trunk, or on the policy's (shared trunk: `trunk` None, the caller passes the features).
"""

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from stack.models.modules import is_abstract


class ScalarHead(nnx.Module):
    """features [..., d_model] -> float32 scores [...]."""

    def __init__(self, d_model: int, seed: int = 0, param_dtype: Any = jnp.float32):
        key = jax.random.key(seed)
        self.kernel = nnx.Param(jax.random.normal(key, (d_model, 1), param_dtype) / (d_model + 1))

    def __call__(self, features: jax.Array) -> jax.Array:
        return (features.astype(jnp.float32) @ self.kernel[...].astype(jnp.float32))[..., 0]


class Critic(nnx.Module):
    """A value model: `head` on `trunk` (a Llama), or on features the caller computed (shared)."""

    def __init__(self, head: ScalarHead, trunk: nnx.Module | None = None):
        self.head, self.trunk = head, trunk


def make_head(policy: nnx.Module, seed: int) -> ScalarHead:
    """A head sized for `policy`'s hidden states (shape-only when the policy is: mode=compile)."""
    d_model = policy.embed.embedding.shape[-1]
    with nnx.use_eager_sharding(False):
        if is_abstract(policy):
            return nnx.eval_shape(lambda: ScalarHead(d_model, seed))
        return ScalarHead(d_model, seed)


def at_last(values: jax.Array, mask: jax.Array) -> jax.Array:
    """values [B, T] read at each row's last position where `mask` > 0 (position 0 if none)."""
    last = jnp.max(jnp.where(mask > 0, jnp.arange(mask.shape[-1]), 0), axis=-1)
    return jnp.take_along_axis(values, last[:, None], axis=-1)[:, 0]
