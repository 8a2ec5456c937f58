"""Post-training quantization (Qwix PTQ) of a trained float model, and what it costs.

Weights are quantized once from the float params (a rule's `weight_qtype`, `tile_size`,
`weight_calibration`). A rule with an `act_qtype` quantizes that layer's input activations
with a STATIC scale (Qwix static-range quantization): the model first runs in Qwix QT mode
with `act_static_scale` over N calibration batches, each forward adding every activation's
calibration (`act_calibration`: absmax | minmax | rms,S | fixed,A,B, per token) to a running
mean in `qwix.QuantStat` variables; the PTQ model's per-tensor activation scale is that mean
(Qwix's convention: batch and token axes are the `act_batch_axes` it averages over, so one
scale serves prefill and one-token decode alike).

`compare` measures the quantized model against the float one on the same batches: mean token
loss of each, top-1 (argmax) agreement and mean |Δ logit| over the loss-masked positions.
"""

from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import qwix
from flax import nnx

from stack.hardware.mesh import bits
from stack.quant.providers import run_once
from stack.quant.rules import qwix_rules


def rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A batch's token arrays as [rows, T] (preference pairs unfolded)."""
    keys = ("inputs", "targets", "loss_mask", "positions", "segment_ids")
    return {k: v.reshape(-1, v.shape[-1]) for k, v in batch.items() if k in keys}


def _forward(model: nnx.Module, batch: dict[str, np.ndarray]) -> jax.Array:
    return model(batch["inputs"], positions=batch.get("positions"), segment_ids=batch.get("segment_ids"))


def calibrate(model: nnx.Module, rules: Sequence[Any], batches: Iterable[dict[str, np.ndarray]]) -> nnx.Module:
    """`model` in Qwix QT mode whose `QuantStat`s hold the running activation calibration of
    `batches` (each forward under jit adds one)."""
    qt = run_once(lambda m, x: qwix.quantize_model(m, qwix.QtProvider(qwix_rules(rules, qwix.QtRule)), x),
                  model, abstract=False)  # the example forward creates the stats, count 0
    forward = nnx.jit(_forward)
    for batch in batches:
        forward(qt, rows(batch))
    return qt


def quantize(model: nnx.Module, rules: Sequence[Any], batches: Iterable[dict[str, np.ndarray]]) -> nnx.Module:
    """The PTQ model of float `model`: quantized weights, static activation scales calibrated
    on `batches` where a rule quantizes activations (weight-only rules read no batch)."""
    source = calibrate(model, rules, batches) if any(r.act_qtype for r in rules) else model
    provider = qwix.PtqProvider(qwix_rules(rules))
    return run_once(lambda m, x: qwix.quantize_model(m, provider, x), source, abstract=False)


def activation_scales(model: nnx.Module) -> dict[str, float]:
    """Each static activation scale of a PTQ model, by its param path."""
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return {"/".join(map(str, k[:-1])): float(np.asarray(v.get_value()).max())
            for k, v in flat if any(str(p).endswith("_lhs_scale") for p in k)}


@nnx.jit
def _sums(reference: nnx.Module, quantized: nnx.Module, batch: dict[str, jax.Array]) -> jax.Array:
    """[Σ mask, Σ float NLL, Σ quantized NLL, Σ top-1 agreement, Σ mean |Δ logit|] over masked tokens."""
    lf, lq = _forward(reference, batch).astype(jnp.float32), _forward(quantized, batch).astype(jnp.float32)
    mask = batch["loss_mask"].astype(jnp.float32)
    nll = [optax.softmax_cross_entropy_with_integer_labels(lg, batch["targets"]) for lg in (lf, lq)]
    agree = (lf.argmax(-1) == lq.argmax(-1)).astype(jnp.float32)
    delta = jnp.abs(lf - lq).mean(-1)
    return jnp.stack([mask.sum(), *[(x * mask).sum() for x in (*nll, agree, delta)]])


def compare(reference: nnx.Module, quantized: nnx.Module, batches: Iterable[dict[str, np.ndarray]]) -> dict[str, float]:
    """Float vs quantized on `batches`: eval losses, top-1 agreement, mean |Δ logit| (loss-masked tokens)."""
    total = sum(np.asarray(_sums(reference, quantized, rows(b)), np.float64) for b in batches)
    n = max(total[0], 1.0)
    return {"eval_tokens": int(total[0]), "eval_loss_float": total[1] / n, "eval_loss_quantized": total[2] / n,
            "top1_agreement": total[3] / n, "mean_abs_logit_delta": total[4] / n}


def weight_bytes(model: nnx.Module) -> int:
    """Bytes of the model's params as stored (int4/nf4 codes: 4 bits)."""
    return int(sum(x.size * bits(x.dtype) // 8 for x in jax.tree.leaves(nnx.state(model, nnx.Param))))
