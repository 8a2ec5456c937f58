"""`model.attention`: the kernel that computes attention over whole sequences (stack.models.attention),
by hardware platform. Null (auto): the core on CPU, the Pallas splash kernel on TPU, and on GPU cuDNN's
flash attention where its constraints hold (bf16/fp16, head size a multiple of 8 up to 128), else XLA's."""

from typing import Any

from stack.errors import ConfigError, bad_choice

# splash on CPU runs in Pallas interpret mode: slow, for tests of the kernel (meshes, a whole run)
RUNS_ON = {"core": ("cpu", "gpu", "tpu"), "splash": ("tpu", "cpu"), "xla": ("cpu", "gpu", "tpu"), "cudnn": ("gpu",)}
AUTO = {"cpu": "core", "tpu": "splash", "gpu": "cudnn"}
SPLASH_BLOCKS = (512, 256, 128)  # the largest dividing T is splash's query and key block
CUDNN_DTYPES, CUDNN_HEAD_DIM = ("bfloat16", "float16"), 128  # cuDNN's fused attention (256 on Hopper only)


def attention_kernel(model: Any, platform: str) -> str:
    """The kernel `model.attention` names, or for null (or a run's config from before the key) the
    platform's (AUTO; on GPU XLA's where cuDNN's constraints do not hold)."""
    kernel = model.get("attention") or AUTO[platform]
    return "xla" if kernel == "cudnn" and not model.get("attention") and cudnn_refuses(model) else kernel


def cudnn_refuses(model: Any) -> str | None:
    """Why cuDNN's fused attention cannot run `model` (its dtype or head size), or None."""
    head_dim = model.head_dim or model.d_model // model.n_heads
    if model.dtype not in CUDNN_DTYPES:
        return f"model.dtype={model.dtype!r} (it takes {' or '.join(CUDNN_DTYPES)})"
    if head_dim % 8 or head_dim > CUDNN_HEAD_DIM:
        return f"a head size of {head_dim} (it takes multiples of 8 up to {CUDNN_HEAD_DIM})"
    return None


def check_attention(model: Any, platform: str, seq_len: int, context: int = 1) -> None:
    """`model.attention` and `model.attention_block` can run on `platform` at `data.seq_len`, each
    sequence split over `context` devices."""
    if model.attention is not None and model.attention not in RUNS_ON:
        raise bad_choice("model.attention", model.attention, [*RUNS_ON, "null (auto)"])
    kernel = attention_kernel(model, platform)
    if platform not in RUNS_ON[kernel]:
        raise ConfigError(f"'model.attention'={kernel!r} does not run on hardware.platform={platform!r}: it runs on "
                          f"{', '.join(RUNS_ON[kernel])}. Leave model.attention=null to pick the platform's kernel.")
    if kernel == "cudnn" and (why := cudnn_refuses(model)):
        raise ConfigError(f"'model.attention'='cudnn' cannot run {why}; choose model.attention=xla or leave it null.")
    block = model.attention_block
    if block is not None and (block < 128 or block % 128):
        raise ConfigError(f"'model.attention_block'={block} must be a positive multiple of 128 (a TPU lane count).")
    if model.attention == "splash" and (seq_len // context) % (block or SPLASH_BLOCKS[-1]):
        raise ConfigError(f"'model.attention'='splash' blocks the sequence by {block or SPLASH_BLOCKS[-1]}, which "
                          f"does not divide data.seq_len={seq_len}" + (f" / mesh.context={context}" if context > 1
                          else "") + ": pad data.seq_len to a multiple of it.")
