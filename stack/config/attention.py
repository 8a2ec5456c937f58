"""`model.attention`: the kernel that computes attention over whole sequences (stack.models.attention),
by hardware platform. Null (auto): the core on CPU, the Pallas splash kernel on TPU, and the core on
GPU until cuDNN's flash attention is verified on one (`cudnn` and `xla` can be chosen there)."""

from typing import Any

from stack.errors import ConfigError, bad_choice

# splash on CPU runs in Pallas interpret mode: slow, for tests of the kernel (meshes, a whole run)
RUNS_ON = {"core": ("cpu", "gpu", "tpu"), "splash": ("tpu", "cpu"), "xla": ("cpu", "gpu", "tpu"), "cudnn": ("gpu",)}
AUTO = {"cpu": "core", "tpu": "splash", "gpu": "core"}
SPLASH_BLOCKS = (512, 256, 128)  # the largest dividing T is splash's query and key block


def attention_kernel(model: Any, platform: str) -> str:
    """The kernel `model.attention` names, or for null (or a run's config from before the key) the
    platform's (AUTO)."""
    return model.get("attention") or AUTO[platform]


def check_attention(model: Any, platform: str, seq_len: int) -> None:
    """`model.attention` and `model.attention_block` can run on `platform` at `data.seq_len`."""
    if model.attention is not None and model.attention not in RUNS_ON:
        raise bad_choice("model.attention", model.attention, [*RUNS_ON, "null (auto)"])
    kernel = attention_kernel(model, platform)
    if platform not in RUNS_ON[kernel]:
        raise ConfigError(f"'model.attention'={kernel!r} does not run on hardware.platform={platform!r}: it runs on "
                          f"{', '.join(RUNS_ON[kernel])}. Leave model.attention=null to pick the platform's kernel.")
    block = model.attention_block
    if block is not None and (block < 128 or block % 128):
        raise ConfigError(f"'model.attention_block'={block} must be a positive multiple of 128 (a TPU lane count).")
    if model.attention == "splash" and seq_len % (block or SPLASH_BLOCKS[-1]):
        raise ConfigError(f"'model.attention'='splash' blocks the sequence by {block or SPLASH_BLOCKS[-1]}, which "
                          f"does not divide data.seq_len={seq_len}: pad data.seq_len to a multiple of it.")
