"""Self-attention over whole sequences by platform (`model.attention`): which kernel computes
softmax(Q K^T / sqrt(hd)) V for causal rows of packed segments (a token sees the earlier-or-equal
tokens of its own segment id; left padding is segment 0).

- `core`: stack.models.attention_core, the [T, T] scores with a hand-written backward, tuned for
  XLA:CPU. Takes any boolean mask (also DPO's shared prompts, `parent_ids`).
- `splash`: the Pallas TPU splash kernel (jax.experimental.pallas.ops.tpu.splash_attention): blocks
  of queries and keys in VMEM, no [T, T] array, causal blocks skipped; segment ids for packing; GQA
  as one MQA kernel per kv head. Under a mesh it runs per shard (`shard_map`: rows over the `batch`
  rule's axes, heads over the `heads` / `kv_heads` rules', queries over the `length` rule's under
  mesh=context, keys and values gathered). `interpret`: Pallas interpret mode, for numerical tests
  on CPU.
- `xla`, `cudnn`: `jax.nn.dot_product_attention` with that implementation (cuDNN: fp16/bf16, head
  size a multiple of 8 up to 128, or 256 on Hopper).

Decode with a KV cache (generation) never comes here: it attends over cache slots
(stack.models.llama). Which kernel a run uses: stack.config.attention.
"""

from __future__ import annotations

import math
from typing import Any

import jax
from flax.core.spmd import get_logical_axis_rules
from jax.sharding import NamedSharding, PartitionSpec

from stack.config.attention import SPLASH_BLOCKS

Array = jax.Array
KERNELS = ("core", "splash", "xla", "cudnn")


def splash_block(t: int, block: int | None = None) -> int | None:
    """Splash's block for sequences of T tokens: `block` if it divides T, else the largest of
    SPLASH_BLOCKS that does; None when none does (the kernel does not apply)."""
    return next((b for b in ((block,) if block else SPLASH_BLOCKS) if t % b == 0), None)


def applies(kernel: str, t: int, block: int | None = None) -> bool:
    """Whether `kernel` computes attention over T tokens (else the model uses the core); splash
    blocks each context shard's T / mesh.context queries."""
    return kernel != "core" and (kernel != "splash" or splash_block(t // context_shards(), block) is not None)


def context_shards() -> int:
    """Devices each sequence is split over: those of the `length` rule's mesh axes (mesh=context)."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty else math.prod(mesh.shape[a] for a in _names(dict(get_logical_axis_rules()).get("length")))


def platform_attention(kernel: str, q: Array, k: Array, v: Array, segments: Array, block: int | None = None,
                       interpret: bool = False, window: int | None = None, scale: float | None = None) -> Array:
    """q [B, T, H, hd] (RoPE applied), k and v [B, T, KV, hd], segments int [B, T] -> [B, T, H, hd];
    `window`: a query sees only the keys within that many tokens up to itself (sliding layers);
    `scale`: of the scores (None: 1/sqrt(hd))."""
    if kernel == "splash":
        return _sharded_splash(q, k, v, segments, block, interpret, window, scale)
    same = segments[:, None, :, None] == segments[:, None, None, :]  # [B, 1, T, S]
    local = None if window is None else (window - 1, 0)
    return jax.nn.dot_product_attention(q, k, v, mask=same, is_causal=True, scale=scale, local_window_size=local,
                                        implementation=kernel)


def _sharded_splash(q: Array, k: Array, v: Array, segments: Array, block: int | None, interpret: bool,
                    window: int | None, scale: float | None) -> Array:
    """The splash kernel per shard of the context mesh: rows and heads split as the rules say; under
    mesh=context each shard's queries (the `length` rule's axes) attend to all keys and values,
    which shard_map gathers (and whose gradients it reduce-scatters), the kernel's causal mask
    split along queries with them (its `q_seq_shards`, as in MaxText's context parallelism)."""
    mesh, shards = jax.sharding.get_abstract_mesh(), context_shards()
    rules = {} if mesh.empty else dict(get_logical_axis_rules())
    rows, heads, kv_heads, length = (rules.get(n) for n in ("batch", "heads", "kv_heads", "length"))
    t, group = q.shape[1], q.shape[2] // k.shape[2]
    kernel = _kernel(t, group, splash_block(t // shards, block), shards, interpret, window)
    scaled = (q * (q.shape[-1] ** -0.5 if scale is None else scale)).astype(q.dtype)  # the kernel does not scale
    if mesh.empty:
        return _splash(kernel, scaled, k, v, segments, segments)
    kv_spec = PartitionSpec(rows, None, kv_heads, None)
    specs = (kernel.manual_sharding_spec(NamedSharding(mesh, PartitionSpec(None, length))),
             PartitionSpec(rows, length, heads, None), kv_spec, kv_spec, PartitionSpec(rows, length),
             PartitionSpec(rows, None))
    return jax.shard_map(_splash, mesh=mesh, in_specs=specs, out_specs=specs[1], check_vma=False)(
        kernel, scaled, k, v, segments, segments)


def _names(axes: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def _kernel(t: int, group: int, block: int, shards: int, interpret: bool, window: int | None = None) -> Any:
    """splash's MQA kernel over `group` query heads of T tokens, causal (within `window` tokens: a
    LocalMask), queries in `shards` parts."""
    # Pallas's TPU kernels (~0.15 s to import): off every run that does not use them (CPU's included)
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash_kernel
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

    sizes = dict.fromkeys(("block_q", "block_kv", "block_kv_compute", "block_q_dkv", "block_kv_dkv",
                           "block_kv_dkv_compute", "block_q_dq", "block_kv_dq"), block)
    one = splash_mask.CausalMask((t, t)) if window is None else splash_mask.LocalMask((t, t), (window - 1, 0), 0)
    mask = splash_mask.MultiHeadMask([one] * group)
    return splash_kernel.make_splash_mqa(mask, block_sizes=splash_kernel.BlockSizes(**sizes), head_shards=1,
                                         q_seq_shards=shards, interpret=interpret)


def _splash(kernel: Any, q: Array, k: Array, v: Array, q_segments: Array, kv_segments: Array) -> Array:
    """The MQA kernel per kv head over its group of query heads, vmapped over kv heads and rows:
    q [B, Tq, H, hd] (scaled), k and v [B, T, KV, hd], segment ids [B, Tq] and [B, T] -> [B, Tq, H, hd]."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash_kernel  # as above

    b, t, h, hd = q.shape
    kv = k.shape[2]
    groups = q.transpose(0, 2, 1, 3).reshape(b, kv, h // kv, t, hd)  # [B, KV, G, Tq, hd]

    def row(qr: Array, kr: Array, vr: Array, qs: Array, ks: Array) -> Array:  # [KV, G, Tq, hd], [KV, T, hd]
        ids = splash_kernel.SegmentIds(q=qs, kv=ks)
        return jax.vmap(lambda qh, kh, vh: kernel(qh, kh, vh, segment_ids=ids))(qr, kr, vr)

    out = jax.vmap(row)(groups, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), q_segments, kv_segments)
    return out.reshape(b, h, t, hd).transpose(0, 2, 1, 3)


__all__ = ["KERNELS", "applies", "platform_attention", "splash_block"]
