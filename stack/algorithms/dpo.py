"""Direct Preference Optimization and its variants, with TRL's DPOTrainer conventions.

- A sequence's log-prob is the SUM of its completion tokens' log-probs (prompt and padding
  carry no loss mask, so they never count).
- Chosen and rejected rows go through ONE forward pass of the policy (the batch's pair axis
  is folded into the batch axis), and one of the frozen reference.
- Loss types (`loss_type`: one name or a list; TRL 1.x: loss = Σ_i `loss_weights`_i × loss_i,
  weights 1 each by default): every loss type of TRL DPOTrainer 1.16, with its formulas and
  f-divergences (`f_divergence_type`), in stack.algorithms.dpo_losses; e.g. `sigmoid`
  −log σ(βΔ), Δ = (log π(c) − log π(r)) − (log π_ref(c) − log π_ref(r)), with label smoothing
  ε: −(1−ε) log σ(βΔ) − ε log σ(−βΔ) (cDPO); `ipo` (Δ̄ − 1/(2β))², Δ̄ from log-probs averaged
  over each completion's tokens. `sft` (TRL ≥ 0.29) and `sft_weight` (TRL ≤ 0.28 `rpo_alpha`) add
  that weight × the chosen completions' mean token NLL (a term of its own: Σ NLL / chosen tokens).
- `trl_compat=true` reproduces TRL 1.16 where this stack differs by default: `sigmoid` ignores
  `label_smoothing` (TRL 1.16 applies ε only to robust, exo_pair, aot, aot_unpaired), and
  `ipo` logs rewards/* from the summed log-ratios (by default, `ipo` alone logs the
  length-normalised ones its loss uses).
- With `data.max_completion_len` (TRL DPOConfig max_completion_length) rows carry
  `completion_positions` and the output head runs at those positions only; with
  `data.share_prompt` a pair is one row holding its prompt once (stack.data.shared_prompt).
- Metrics (TRL's names): rewards/chosen = β(log π(c) − log π_ref(c)) averaged over pairs,
  rewards/rejected likewise, rewards/margins their difference, rewards/accuracies the
  fraction with chosen reward strictly above rejected, logps/chosen, logps/rejected.

The reference's log-probs are computed in `collect` (one forward per micro-batch, no
gradient) and read by the loss from the experience (`ref_logps`, [batch, 2]). The reference:
- a frozen copy of the initial policy (the default; `model.init_from` sets both);
- `reference.init_from`: the params of another stack run (a checkpoints dir);
- the quantization provider's base view when it has one (LoRA: the policy with its adapters
  off), so no second copy of the base weights exists (not combinable with `reference.init_from`).
With `precompute_reference=true` the trainer runs `collect` once over every record before
training (stack.engine.precompute) and stores `ref_logps` with the data state in each checkpoint;
no reference model is kept or run during training.
"""

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from stack.algorithms.base import Batch, Context, Metrics, Schedule, Setup, Terms, loss_metrics, map_micro, real_tokens
from stack.algorithms.dpo_losses import LossParams, Pairs, pair_losses, rewards
from stack.algorithms.reference import Reference
from stack.config.schema.algorithm import DPOConfig

LOSS_TYPES = DPOConfig.loss_types


def dpo_loss(policy_c: jax.Array, policy_r: jax.Array, ref_c: jax.Array, ref_r: jax.Array, beta: float,
             loss_type: str = "sigmoid", label_smoothing: float = 0.0) -> jax.Array:
    """Per-pair losses from sequence log-probs (for `ipo` and `sigmoid_norm`: already length-normalised)."""
    ones = jnp.ones_like(policy_c)
    pairs = Pairs(policy_c, policy_r, ref_c, ref_r, ones, ones)
    return pair_losses(pairs, LossParams(beta, label_smoothing), (loss_type,))


def sequence_logps(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum of masked target log-probs, masked token count) per row."""
    token_logps = -optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    return (token_logps * mask).sum(-1), mask.sum(-1)


def _fold(batch: Batch) -> Batch:
    """[B, 2, ...] pairs -> [2B, ...] rows: c0, r0, c1, r1, ..."""
    return {k: v.reshape(-1, *v.shape[2:]) for k, v in batch.items()}


def _logps(model: nnx.Module, batch: Batch) -> tuple[jax.Array, jax.Array]:
    """(sequence log-prob, completion tokens) of each row, [2B] (c0, r0, c1, r1, ...), of a pair
    batch [B, 2, T] or of shared-prompt rows [B, W]; with `completion_positions` (data.max_completion_len)
    the head runs at those positions only (stack.data.shared_prompt)."""
    flat = batch if "parent_ids" in batch else _fold(batch)
    inputs = dict(positions=flat.get("positions"), segment_ids=flat.get("segment_ids"),
                  **({"parent_ids": flat["parent_ids"]} if "parent_ids" in flat else {}))
    if "completion_positions" not in flat:
        logits = model(flat["inputs"], **inputs)
        return sequence_logps(logits, flat["targets"], flat["loss_mask"].astype(jnp.float32))
    rows = flat["inputs"].shape[0]
    at, targets, mask = (flat[f"completion_{k}"].reshape(rows, -1) for k in ("positions", "targets", "mask"))
    logps, _ = model(flat["inputs"], **inputs, targets=targets, at=at)
    k = batch["completion_positions"].shape[-1]
    return (logps * mask).reshape(-1, k).sum(-1), mask.reshape(-1, k).sum(-1)


class DPO:
    """Batches are preference pairs: every key shaped [batch, 2 (chosen, rejected), seq]."""

    data_kinds = DPOConfig.data_kinds
    schedule = Schedule()
    score = scores_spec = finalize = keep = interact = None

    def __init__(self, name: str = "dpo", beta: float = 0.1, loss_type: str | Sequence[str] = "sigmoid",
                 label_smoothing: float = 0.0, sft_weight: float = 0.0, reference: dict[str, Any] | None = None,
                 precompute_reference: bool = False, loss_weights: Sequence[float] | None = None,
                 discopop_tau: float = 0.05, f_divergence_type: str = "reverse_kl",
                 f_alpha_divergence_coef: float = 0.5, trl_compat: bool = False):
        self.name, self.beta, self.loss_type = name, beta, loss_type
        self.loss_types = (loss_type,) if isinstance(loss_type, str) else tuple(loss_type)
        self.loss_weights = (1.0,) * len(self.loss_types) if loss_weights is None else tuple(map(float, loss_weights))
        self.params = LossParams(beta, label_smoothing, discopop_tau, f_divergence_type, f_alpha_divergence_coef,
                                 trl_compat)
        self.label_smoothing = label_smoothing
        # the chosen-NLL weight: sft_weight plus the weights of `sft` entries
        self.sft_weight = sft_weight + sum(w for t, w in zip(self.loss_types, self.loss_weights, strict=True)
                                           if t == "sft")
        self.normalised_rewards = self.loss_types == ("ipo",) and not trl_compat
        self.reference = Reference((reference or {}).get("init_from"))
        self.precomputes = precompute_reference

    def setup(self, policy: nnx.Module, ctx: Context) -> Setup:
        """The frozen reference (stack.algorithms.reference)."""
        return Setup(frozen=self.reference.setup(policy, ctx))

    def collect(self, models: nnx.Module, frozen: Any, state: Any, batch: Batch, key: jax.Array,
                train: bool) -> Batch:
        """The batch plus the reference's sequence log-probs `ref_logps` [n, B, 2] (unless precomputed)."""
        if "ref_logps" in batch:
            return batch
        reference = self.reference.model(models, frozen)
        ref = map_micro(lambda b: _logps(reference, b)[0].reshape(-1, 2), batch)
        return {**batch, "ref_logps": jax.lax.stop_gradient(ref)}

    def batch_tokens(self, batch: dict[str, Any]) -> int:
        return int(batch["inputs"].size)

    def loss(self, models: nnx.Module, batch: Batch, frozen: Any, state: Any, key: jax.Array) -> tuple[Terms, Metrics]:
        """Terms: (Σ pair losses, n pairs), and with an sft weight (weight × Σ chosen NLL, chosen tokens)."""
        policy, tokens = _logps(models.policy, {k: v for k, v in batch.items() if k != "ref_logps"})
        ref = batch["ref_logps"].reshape(-1)
        pairs = Pairs(policy[0::2], policy[1::2], ref[0::2], ref[1::2], tokens[0::2], tokens[1::2])
        losses = pair_losses(pairs, self.params, self.loss_types, self.loss_weights)
        num, den = losses.sum(), jnp.asarray(losses.shape[0], jnp.float32)
        if self.sft_weight:
            num = jnp.stack([num, -self.sft_weight * policy[0::2].sum()])
            den = jnp.stack([den, tokens[0::2].sum()])
        chosen, rejected = rewards(pairs, self.beta, self.normalised_rewards)
        return (num, den), {
            "rewards/chosen": chosen.mean(),
            "rewards/rejected": rejected.mean(),
            "rewards/margins": (chosen - rejected).mean(),
            "rewards/accuracies": (chosen > rejected).astype(jnp.float32).mean(),
            "logps/chosen": policy[0::2].mean(),
            "logps/rejected": policy[1::2].mean(),
            **real_tokens(batch),
        }

    def evaluate(self, models: nnx.Module, xp: Batch, scores: Any, frozen: Any, state: Any) -> Metrics:
        return loss_metrics(self.loss, models, xp, frozen, state)
