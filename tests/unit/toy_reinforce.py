"""A test-only on-policy algorithm that exercises every member of the Algorithm protocol.

Each round samples one token per prompt from the policy's next-token distribution over the
first K ids; the reward is 1 when it equals TARGET (scored on the host). REINFORCE with a
learned baseline (an extra trained module): loss = −(r − b)·log π(a) + (r − b)². The
algorithm state counts rounds; eval reports the greedy token's reward.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stack.algorithms.base import Schedule, Setup

K, TARGET = 4, 2


class Baseline(nnx.Module):
    def __init__(self):
        self.value = nnx.Param(jnp.zeros(()))


def next_token_logits(policy, batch):
    """Logits over the first K ids after each (left-padded) prompt: [..., K]."""
    ids, mask = batch["prompt_ids"], batch["prompt_mask"]
    flat_ids, flat_mask = ids.reshape(-1, ids.shape[-1]), mask.reshape(-1, mask.shape[-1])
    positions = jnp.maximum(jnp.cumsum(flat_mask, -1) - 1, 0)
    logits = policy(flat_ids, positions=positions, segment_ids=flat_mask)[:, -1, :K]
    return logits.reshape(*ids.shape[:-1], K)


class Reinforce:
    data_kinds = ("prompt",)
    schedule = Schedule(epochs=2, minibatches=2)
    precomputes = False
    keep = interact = None  # every sampled row is trained on; collect samples on its own

    def setup(self, policy, ctx):
        return Setup(trained={"baseline": Baseline()}, state={"rounds": jnp.zeros((), jnp.int32)})

    def collect(self, models, frozen, state, batch, key, train):
        logits = next_token_logits(models.policy, batch)
        action = jax.random.categorical(key, logits) if train else jnp.argmax(logits, -1)
        return {**batch, "action": action}

    @staticmethod
    def score(xp, host):
        assert host["answer"].shape == xp["action"].shape  # the host columns ride along
        return (np.asarray(jax.device_get(xp["action"])) == TARGET).astype(np.float32)

    @staticmethod
    def scores_spec(xp):
        return jax.ShapeDtypeStruct(xp["action"].shape, jnp.float32)

    def finalize(self, xp, scores, state):
        return {**xp, "reward": scores}, {"rounds": state["rounds"] + 1}, {"reward": scores.mean()}

    def loss(self, models, batch, frozen, state, key):
        logp = jax.nn.log_softmax(next_token_logits(models.policy, batch))
        taken = jnp.take_along_axis(logp, batch["action"][..., None], -1)[..., 0]
        advantage = batch["reward"] - models.baseline.value[...]
        num = (-jax.lax.stop_gradient(advantage) * taken + advantage**2).sum()
        return (num, jnp.asarray(taken.size, jnp.float32)), {"rounds": state["rounds"].astype(jnp.float32)}

    def evaluate(self, models, xp, scores, frozen, state):
        return {"reward": scores.mean()}

    def batch_tokens(self, batch):
        return int(batch["prompt_ids"].size)
