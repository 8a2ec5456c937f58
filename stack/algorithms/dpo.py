"""Direct Preference Optimization and its variants, with TRL's DPOTrainer conventions.

- A sequence's log-prob is the SUM of its completion tokens' log-probs (prompt and padding
  carry no loss mask, so they never count).
- Chosen and rejected rows go through ONE forward pass of the policy (the batch's pair axis
  is folded into the batch axis), and one of the frozen reference.
- Δ = (log π(c) − log π(r)) − (log π_ref(c) − log π_ref(r)). Loss types:
  `sigmoid`  −log σ(βΔ), with label smoothing ε: −(1−ε) log σ(βΔ) − ε log σ(−βΔ) (cDPO);
  `hinge`    max(0, 1 − βΔ);
  `ipo`      (Δ̄ − 1/(2β))², Δ̄ from log-probs averaged over each completion's tokens;
  `robust`   ((1−ε)(−log σ(βΔ)) + ε log σ(−βΔ)) / (1 − 2ε), 0 ≤ ε < 0.5.
  `sft_weight` adds that weight × the chosen completions' mean token NLL (TRL's `rpo_alpha`).
- Metrics (TRL's names): rewards/chosen = β(log π(c) − log π_ref(c)) averaged over pairs,
  rewards/rejected likewise, rewards/margins their difference, rewards/accuracies the
  fraction with chosen reward strictly above rejected, logps/chosen, logps/rejected.

The reference is one of:
- a frozen copy of the initial policy (the default; `model.init_from` sets both);
- `reference.init_from`: the params of another stack run (a checkpoints dir);
- with LoRA (`quantization.method=lora`): the policy itself with its adapters off (LoRA params
  zeroed inside the step), so no second copy of the base weights exists (not combinable
  with `reference.init_from`).
With `precompute_reference=true` the reference log-probs of every record are computed once
before training (stack.precompute), stored with the data state in each checkpoint, and read
from the batch (`ref_logps`, [batch, 2]); no reference model is kept or run during training.
"""

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from stack.algorithms.base import Metrics
from stack.errors import ConfigError

LOSS_TYPES = ("sigmoid", "hinge", "ipo", "robust")


def dpo_loss(policy_c: jax.Array, policy_r: jax.Array, ref_c: jax.Array, ref_r: jax.Array, beta: float,
             loss_type: str = "sigmoid", label_smoothing: float = 0.0) -> jax.Array:
    """Per-pair losses from sequence log-probs (for `ipo`: already length-normalised)."""
    delta = (policy_c - policy_r) - (ref_c - ref_r)
    eps = label_smoothing
    if loss_type == "sigmoid":
        return -(1 - eps) * jax.nn.log_sigmoid(beta * delta) - eps * jax.nn.log_sigmoid(-beta * delta)
    if loss_type == "hinge":
        return jax.nn.relu(1 - beta * delta)
    if loss_type == "ipo":
        return (delta - 1 / (2 * beta)) ** 2
    if loss_type == "robust":
        return (-(1 - eps) * jax.nn.log_sigmoid(beta * delta) + eps * jax.nn.log_sigmoid(-beta * delta)) / (1 - 2 * eps)
    raise ValueError(f"unknown DPO loss_type {loss_type!r}; one of {LOSS_TYPES}")


def sequence_logps(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum of masked target log-probs, masked token count) per row."""
    token_logps = -optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    return (token_logps * mask).sum(-1), mask.sum(-1)


def _logps(model: nnx.Module, flat: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """(sequence log-prob, completion tokens) of each row of a folded [2B, T] batch."""
    logits = model(flat["inputs"], positions=flat.get("positions"), segment_ids=flat.get("segment_ids"))
    return sequence_logps(logits, flat["targets"], flat["loss_mask"].astype(jnp.float32))


class DPO:
    """Batches are preference pairs: every key shaped [batch, 2 (chosen, rejected), seq]."""

    data_kinds = ("preference",)

    def __init__(self, name: str = "dpo", beta: float = 0.1, loss_type: str = "sigmoid",
                 label_smoothing: float = 0.0, sft_weight: float = 0.0, reference: dict[str, Any] | None = None,
                 precompute_reference: bool = False):
        self.name, self.beta, self.loss_type = name, beta, loss_type
        self.label_smoothing, self.sft_weight = label_smoothing, sft_weight
        self.reference_init_from = (reference or {}).get("init_from")
        self.precomputes = precompute_reference
        self._graphdef = self._rest = None

    def frozen(self, model: nnx.Module) -> Any:
        """The reference params: a copy of the initial policy's (or loaded from reference.init_from);
        None for a LoRA policy, whose reference is itself with the adapters off."""
        if jax.tree.leaves(nnx.state(model, nnx.LoRAParam)):
            if self.reference_init_from:
                raise ConfigError("'algorithm.reference.init_from' cannot be combined with LoRA "
                                  "(quantization.method=lora): the reference is the base model with adapters off.")
            return None
        self._graphdef, params, self._rest = nnx.split(model, nnx.Param, ...)
        copy = jax.tree.map(lambda x: jnp.copy(x) if isinstance(x, jax.Array) else x, params)
        shape_only = any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(copy))  # mode=compile
        if self.reference_init_from and not shape_only:
            from stack.checkpoint import load_params

            reference = nnx.merge(self._graphdef, copy, self._rest)
            load_params(reference, self.reference_init_from)
            copy = nnx.state(reference, nnx.Param)
        return copy

    def reference(self, model: nnx.Module, frozen: Any) -> nnx.Module:
        """The reference model: from its frozen params, or (None) `model` with its LoRA adapters zeroed."""
        if frozen is not None:
            return nnx.merge(self._graphdef, jax.lax.stop_gradient(frozen), self._rest)
        graphdef, adapters, rest = nnx.split(model, nnx.LoRAParam, ...)
        return nnx.merge(graphdef, jax.tree.map(jnp.zeros_like, adapters), rest)

    def columns(self, model: nnx.Module, batch: dict[str, jax.Array], frozen: Any) -> dict[str, jax.Array]:
        """The reference's sequence log-probs of each pair, `ref_logps` [batch, 2 (chosen, rejected)]."""
        flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in batch.items()}
        ref, _ = _logps(self.reference(model, frozen), flat)
        return {"ref_logps": ref.reshape(-1, 2)}

    def batch_tokens(self, batch: dict[str, Any]) -> int:
        return int(batch["inputs"].size)

    def loss(self, model: nnx.Module, batch: dict[str, jax.Array], frozen: Any) -> tuple[jax.Array, Metrics]:
        flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in batch.items()}  # [2B, T]: c0, r0, c1, r1, ...
        policy, tokens = _logps(model, flat)
        if "ref_logps" in flat:  # precomputed before training (stack.precompute)
            ref = flat["ref_logps"]
        else:
            ref = _logps(self.reference(model, frozen), flat)[0]
        ref = jax.lax.stop_gradient(ref)
        if self.loss_type == "ipo":  # length-normalised log-ratios
            policy_n, ref_n = policy / jnp.maximum(tokens, 1.0), ref / jnp.maximum(tokens, 1.0)
        else:
            policy_n, ref_n = policy, ref
        pc, pr = policy_n[0::2], policy_n[1::2]
        rc, rr = ref_n[0::2], ref_n[1::2]
        losses = dpo_loss(pc, pr, rc, rr, self.beta, self.loss_type, self.label_smoothing)
        loss = losses.mean()
        if self.sft_weight:
            loss = loss + self.sft_weight * (-policy[0::2].sum() / jnp.maximum(tokens[0::2].sum(), 1.0))
        chosen, rejected = self.beta * (pc - rc), self.beta * (pr - rr)
        return loss, {
            "rewards/chosen": chosen.mean(),
            "rewards/rejected": rejected.mean(),
            "rewards/margins": (chosen - rejected).mean(),
            "rewards/accuracies": (chosen > rejected).astype(jnp.float32).mean(),
            "logps/chosen": policy[0::2].mean(),
            "logps/rejected": policy[1::2].mean(),
        }

