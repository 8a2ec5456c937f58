"""Reward modelling with a Bradley–Terry loss, with the conventions of TRL's RewardTrainer (1.x).

- The model: the policy's Llama trunk and a scalar head (`score`, stack.models.heads) read at
  the last non-padding token of the whole sequence (BOS, prompt, completion, EOS), as HF's
  `LlamaForSequenceClassification`. The trunk's LM head is not used.
- Loss per pair: −log σ(r_chosen − r_rejected − margin) (the record's optional `margin`
  column, 0 when absent), plus `center_rewards_coefficient` × (r_chosen + r_rejected)²
  (Eisenstein et al. 2023, TRL's `center_rewards_coefficient`); averaged over pairs.
- Metrics: `accuracy` (fraction of pairs with r_chosen > r_rejected), `margin` (mean of
  r_chosen − r_rejected), `rewards/chosen`, `rewards/rejected` (mean scores), `mean_reward`.
- A trained reward model scores text with `stack.rewards.model.score_texts` or
  `python -m stack.tools.generate RUN/checkpoints --prompt P --score C`; GRPO and PPO read it with `reward=model`.
"""

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from stack.algorithms.base import Batch, Context, Metrics, Schedule, Setup, Terms, loss_metrics
from stack.config.schema.rlhf import RMConfig
from stack.models.heads import ScalarHead, at_last, make_head
from stack.rewards.model import pair_rows


def sequence_scores(trunk: nnx.Module, head: ScalarHead, tokens: jax.Array, segments: jax.Array,
                    positions: jax.Array | None = None) -> jax.Array:
    """Scores [B] of token rows [B, T] at each row's last real token (`segments` > 0)."""
    features = trunk(tokens, positions, segments, features=True)
    return at_last(head(features), segments)


def bradley_terry(chosen: jax.Array, rejected: jax.Array, margin: jax.Array | float = 0.0,
                  center: float = 0.0) -> jax.Array:
    """Per-pair −log σ(r_c − r_r − margin) + center · (r_c + r_r)² (TRL RewardTrainer)."""
    return -jax.nn.log_sigmoid(chosen - rejected - margin) + center * (chosen + rejected) ** 2


class RewardModel:
    """Batches are preference pairs: token keys shaped [batch, 2 (chosen, rejected), seq]."""

    data_kinds = RMConfig.data_kinds
    schedule = Schedule()
    precomputes = False
    collect = score = scores_spec = finalize = keep = interact = None  # the batch is the experience

    def __init__(self, name: str = "rm", center_rewards_coefficient: float = 0.0):
        self.name, self.center = name, center_rewards_coefficient

    def setup(self, policy: nnx.Module, ctx: Context) -> Setup:
        """The scalar head `score`, trained with the trunk."""
        return Setup(trained={"score": make_head(policy, ctx.seed)})

    def loss(self, models: nnx.Module, batch: Batch, frozen: Any, state: Any, key: jax.Array) -> tuple[Terms, Metrics]:
        tokens, segments = pair_rows(batch)
        scores = sequence_scores(models.policy, models.score, tokens, segments)
        chosen, rejected = scores[0::2], scores[1::2]
        losses = bradley_terry(chosen, rejected, batch.get("margin", 0.0), self.center)
        return (losses.sum(), jnp.float32(losses.shape[0])), {
            "accuracy": (chosen > rejected).astype(jnp.float32).mean(),
            "margin": (chosen - rejected).mean(),
            "rewards/chosen": chosen.mean(),
            "rewards/rejected": rejected.mean(),
            "mean_reward": scores.mean(),
        }

    def evaluate(self, models: nnx.Module, xp: Batch, scores: Any, frozen: Any, state: Any) -> Metrics:
        return loss_metrics(self.loss, models, xp, frozen, state)

    def batch_tokens(self, batch: dict[str, Any]) -> int:
        return int(batch["inputs"].size)
