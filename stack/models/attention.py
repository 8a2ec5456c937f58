"""Self-attention over whole sequences by platform (`model.attention`): which kernel computes
softmax(Q K^T / sqrt(hd)) V for causal rows of packed segments (a token sees the earlier-or-equal
tokens of its own segment id; left padding is segment 0).

- `core`: stack.models.attention_core, the [T, T] scores with a hand-written backward, tuned for
  XLA:CPU. Takes any boolean mask (also DPO's shared prompts, `parent_ids`).
- `splash`: the Pallas TPU splash kernel (jax.experimental.pallas.ops.tpu.splash_attention): blocks
  of queries and keys in VMEM, no [T, T] array, causal blocks skipped; segment ids for packing; GQA
  as one MQA kernel per kv head. Under a mesh it runs per shard (`shard_map`: rows over the `batch`
  rule's axes, heads over the `heads` / `kv_heads` rules'). `interpret`: Pallas interpret mode, for
  numerical tests on CPU.
- `xla`, `cudnn`: `jax.nn.dot_product_attention` with that implementation (cuDNN: fp16/bf16, head
  size a multiple of 8 up to 128, or 256 on Hopper).

Decode with a KV cache (generation) never comes here: it attends over cache slots
(stack.models.llama). Which kernel a run uses: stack.config.attention.
"""

from __future__ import annotations

import functools

import jax
from flax.core.spmd import get_logical_axis_rules
from jax.sharding import PartitionSpec

from stack.config.attention import SPLASH_BLOCKS

Array = jax.Array
KERNELS = ("core", "splash", "xla", "cudnn")


def splash_block(t: int, block: int | None = None) -> int | None:
    """Splash's block for sequences of T tokens: `block` if it divides T, else the largest of
    SPLASH_BLOCKS that does; None when none does (the kernel does not apply)."""
    return next((b for b in ((block,) if block else SPLASH_BLOCKS) if t % b == 0), None)


def applies(kernel: str, t: int, block: int | None = None) -> bool:
    """Whether `kernel` computes attention over T tokens (else the model uses the core)."""
    return kernel != "core" and (kernel != "splash" or splash_block(t, block) is not None)


def platform_attention(kernel: str, q: Array, k: Array, v: Array, segments: Array, block: int | None = None,
                       interpret: bool = False) -> Array:
    """q [B, T, H, hd] (RoPE applied), k and v [B, T, KV, hd], segments int [B, T] -> [B, T, H, hd]."""
    if kernel == "splash":
        return _sharded_splash(q, k, v, segments, splash_block(q.shape[1], block), interpret)
    same = segments[:, None, :, None] == segments[:, None, None, :]  # [B, 1, T, S]
    return jax.nn.dot_product_attention(q, k, v, mask=same, is_causal=True, implementation=kernel)


def _sharded_splash(q: Array, k: Array, v: Array, segments: Array, block: int, interpret: bool) -> Array:
    """The splash kernel per shard of the context mesh (rows and heads split as the rules say)."""
    run = functools.partial(_splash, block=block, interpret=interpret)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return run(q, k, v, segments)
    rules = dict(get_logical_axis_rules())
    rows, heads, kv_heads = rules.get("batch"), rules.get("heads"), rules.get("kv_heads")
    specs = (PartitionSpec(rows, None, heads, None), PartitionSpec(rows, None, kv_heads, None),
             PartitionSpec(rows, None, kv_heads, None), PartitionSpec(rows, None))
    return jax.shard_map(run, mesh=mesh, in_specs=specs, out_specs=specs[0], check_vma=False)(q, k, v, segments)


def _splash(q: Array, k: Array, v: Array, segments: Array, block: int, interpret: bool) -> Array:
    """One MQA splash kernel per kv head over its group of query heads, vmapped over kv heads and rows."""
    # Pallas's TPU kernels (~0.15 s to import): off every run that does not use them (CPU's included)
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash_kernel
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

    b, t, h, hd = q.shape
    kv = k.shape[2]
    sizes = dict.fromkeys(("block_q", "block_kv", "block_kv_compute", "block_q_dkv", "block_kv_dkv",
                           "block_kv_dkv_compute", "block_q_dq", "block_kv_dq"), block)
    mask = splash_mask.MultiHeadMask([splash_mask.CausalMask((t, t))] * (h // kv))
    kernel = splash_kernel.make_splash_mqa(mask, block_sizes=splash_kernel.BlockSizes(**sizes), head_shards=1,
                                           q_seq_shards=1, interpret=interpret)
    scaled = (q * (hd ** -0.5)).astype(q.dtype)  # the kernel does not scale the scores
    groups = scaled.transpose(0, 2, 1, 3).reshape(b, kv, h // kv, t, hd)  # [B, KV, G, T, hd]

    def row(qr: Array, kr: Array, vr: Array, sr: Array) -> Array:  # one row: [KV, G, T, hd], [KV, T, hd]
        ids = splash_kernel.SegmentIds(q=sr, kv=sr)
        return jax.vmap(lambda qh, kh, vh: kernel(qh, kh, vh, segment_ids=ids))(qr, kr, vr)

    out = jax.vmap(row)(groups, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), segments)
    return out.reshape(b, h, t, hd).transpose(0, 2, 1, 3)


__all__ = ["KERNELS", "applies", "platform_attention", "splash_block"]
