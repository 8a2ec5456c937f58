"""Hardware targets: device checks, peak FLOP/s (published or measured) and MFU."""

from __future__ import annotations

import json
import os
import time
import warnings
from collections import Counter
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stack.errors import ConfigError


def matmul_params(model_cfg: Any) -> int:
    """Weights that enter a token's matmuls: q/k/v/o and the SwiGLU MLP of every layer (with routed
    experts: the router and the k experts a token reaches, MaxText's active parameters), plus the
    output projection (vocab × d_model, counted once even when tied). Excludes norms and the
    embedding lookup."""
    m = model_cfg
    hd = m.head_dim or m.d_model // m.n_heads
    attn = m.d_model * (m.n_heads + 2 * m.n_kv_heads) * hd + m.n_heads * hd * m.d_model
    experts = getattr(m, "num_experts", None)
    if experts:
        mlp = m.d_model * experts + m.num_experts_per_tok * 3 * m.d_model * (getattr(m, "moe_d_ff", None) or m.d_ff)
    else:
        mlp = 3 * m.d_model * m.d_ff  # gate, up, down
    return m.n_layers * (attn + mlp) + m.vocab_size * m.d_model


def trained_length(cfg: Any) -> int:
    """Tokens of a trained sequence: data.seq_len, + the completion's algorithm.max_new_tokens where
    the algorithm samples them after the prompt (GRPO, PPO)."""
    return cfg.data.seq_len + (cfg.algorithm.get("max_new_tokens") or 0)


def train_flops_per_token(model_cfg: Any, seq_len: int, causal: bool = True) -> float:
    """Training FLOPs (forward + backward) per token, as MaxText counts them.

    Follows the dense branch of `calculate_tflops_training_per_device` in MaxText
    (AI-Hypercomputer/maxtext, src/MaxText/maxtext_utils.py), divided by the tokens per
    device step (per_device_batch_size × max_target_length):
      learnable = 3 × [L × (ffn + qkv + proj) + embedding], per token
        ffn  = 2·E·F·len(mlp_activations) + 2·F·E   (SwiGLU: 2 activations → 6·E·F)
        qkv  = 2·E·(H + 2·KV)·D,  proj = 2·E·H·D,  embedding (logits) = 2·E·V
      i.e. 6 × matmul_params(model_cfg);
      attention = 3 × L × causal, causal = noncausal / 2 = 4·S·H·D / 2 per token,
      i.e. 6·L·H·D·S: MaxText halves the attention term for the causal mask.
    A sliding layer's query attends to at most `model.sliding_window` (W) keys: W − W²/2S on
    average in place of S/2 (W < S).
    `causal=False`: the full [T, T] square (12·L·H·D·S), what a kernel that skips no block computes.
    """
    m = model_cfg
    hd = m.head_dim or m.d_model // m.n_heads
    keys = sum(_keys_per_query(seq_len, w, causal) for w in _windows(m))
    return float(6 * matmul_params(m) + 3 * 4 * m.n_heads * hd * keys)


def _windows(m: Any) -> list[int | None]:
    """Each layer's sliding window (None: full attention), from `sliding_window` and `layer_types`."""
    window, types = getattr(m, "sliding_window", None), getattr(m, "layer_types", None)
    if window is None:
        return [None] * m.n_layers
    return [window if types is None or t == "sliding_attention" else None for t in (types or [None] * m.n_layers)]


def _keys_per_query(s: int, window: int | None, causal: bool) -> float:
    """The keys a query attends to on average over a sequence of S tokens."""
    if not causal:
        return float(s)
    return s / 2 if window is None or window >= s else window - window * window / (2 * s)


def machine_busy() -> bool:
    """Whether other work keeps the cores busy: a 1-minute load average above half of them."""
    return os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1)


def cpu_clock() -> tuple[float, float, float] | None:
    """(wall seconds, CPU seconds the machine's cores have been busy, this process's CPU seconds);
    None without Linux's /proc/stat."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        return None
    busy = sum(ticks) - ticks[3] - ticks[4]
    return time.perf_counter(), busy / os.sysconf("SC_CLK_TCK"), time.process_time()


def cores_used_by_others(since: tuple[float, float, float] | None) -> float:
    """The cores other processes kept busy on average since `since` (a `cpu_clock()`); 0 unknown."""
    now = cpu_clock()
    if since is None or now is None or now[0] <= since[0]:
        return 0.0
    others = (now[1] - since[1]) - (now[2] - since[2])
    return max(others, 0.0) / (now[0] - since[0])


# cached probes of another version are measured again (1: taken in build, beside stack.engine.precompile)
PROBE_VERSION = 2


def measure_cpu_peak(cache_file: str | None = None, n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of the best of `repeats` jitted float32 n×n matmuls on this process's first CPU device.

    With `cache_file` (per machine: stack.hardware.compile_cache.machine_file) a probe is measured once and read
    back. One taken while the machine was busy (`machine_busy`: a parallel sweep, a test run; or
    other processes using a quarter of the cores during the probe, which the load average, a
    minute behind, misses: a probe beside a pip install read 110 of 209 GFLOP/s) would understate
    the peak, so it is marked and measured again by the first run that finds the machine idle.
    An unwritable cache only costs the probe next time. A probe of an older PROBE_VERSION is
    measured again: version 1 was taken while stack.engine.precompile compiled in the same process (it
    read 184-223 GFLOP/s on a machine whose idle probe reads 250-418).
    """
    cached = _read_probe(cache_file)
    busy = machine_busy()
    if cached and cached.get("version") == PROBE_VERSION and (not cached.get("busy") or busy):
        return float(cached["flops_per_sec"])
    dev = jax.local_devices(backend="cpu")[0]  # this process's own (device 0 is process 0's)
    a = jax.device_put(np.ones((n, n), np.float32), dev)  # from the host: no program to compile
    b = jax.device_put(np.full((n, n), 0.5, np.float32), dev)
    mm = jax.jit(jnp.matmul)
    with jax.set_mesh(None):  # one device, whatever mesh the caller runs under (the trainer asks inside its own)
        mm(a, b).block_until_ready()  # compile + warm up
        best, since = float("inf"), cpu_clock()
        for _ in range(repeats):
            t0 = time.perf_counter()
            mm(a, b).block_until_ready()
            best = min(best, time.perf_counter() - t0)
    busy = busy or cores_used_by_others(since) > 0.25 * (os.cpu_count() or 1)
    peak = 2 * n**3 / best
    if cache_file:
        _write_probe(cache_file, {"flops_per_sec": peak, "n": n, "repeats": repeats, "seconds": best,
                                  "dtype": "float32", "cpu_count": os.cpu_count(), "busy": busy,
                                  "version": PROBE_VERSION})
    return peak


def _read_probe(cache_file: str | None) -> dict[str, Any] | None:
    if not cache_file or not os.path.exists(cache_file):
        return None
    with open(cache_file) as f:
        return json.load(f)


def _write_probe(cache_file: str, probe: dict[str, Any]) -> None:
    try:
        os.makedirs(os.path.dirname(cache_file) or ".", exist_ok=True)
        tmp = f"{cache_file}.{os.getpid()}.tmp"  # parallel runs each write their own
        with open(tmp, "w") as f:
            json.dump(probe, f)
        os.replace(tmp, cache_file)
    except OSError:
        pass


def peak_flops_per_device(hw_cfg: Any, cache_file: str | None = None, devices: int = 1) -> float:
    """The published peak of one chip, or for `peak_flops_per_chip: null` the measured CPU peak
    divided by `devices`, the mesh's: fake CPU devices share the host's cores, and a mesh of one
    of them has all of them (dividing by every CPU device made a 1-device mesh's MFU 8x with 8)."""
    if hw_cfg.peak_flops_per_chip is not None:
        return float(hw_cfg.peak_flops_per_chip)
    return measure_cpu_peak(cache_file) / devices


def _describe(devices: list) -> str:
    counts = Counter((d.platform, d.device_kind) for d in devices)
    return ", ".join(f"{p} × {c} ({kind!r})" for (p, kind), c in sorted(counts.items()))


def check_platform(hw_cfg: Any) -> list:
    """The devices of `hw_cfg.platform`. Raises ConfigError when there are none; warns when
    there are fewer than `hw_cfg.chips` or their device_kind differs from the config's."""
    platform = hw_cfg.platform
    try:
        devices = jax.devices(platform)
    except RuntimeError:
        devices = []
    asked = (f"hardware={hw_cfg.name} asks for {hw_cfg.chips} {platform} chip(s) "
             f"(device_kind {hw_cfg.device_kind!r}, topology {hw_cfg.topology or 'n/a'})")
    if not devices:
        compile_hint = "mode=compile to AOT-compile for the target from this machine"
        if platform == "tpu":
            compile_hint += ' (TPU targets need pip install -e ".[tpu]" for libtpu)'
        raise ConfigError(
            f"{asked}, but this machine has no {platform} devices: it has "
            f"{_describe(jax.devices())}. Either run here with hardware=cpu, or use "
            f"{compile_hint}."
        )
    if len(devices) < hw_cfg.chips:
        warnings.warn(f"{asked}, but only {len(devices)} {platform} device(s) are present "
                      f"({_describe(devices)}); running on those.", stacklevel=2)
    if hw_cfg.device_kind and devices[0].device_kind != hw_cfg.device_kind:
        warnings.warn(f"{asked}, but the devices here are {_describe(devices)}: peak FLOP/s "
                      f"and MFU refer to {hw_cfg.device_kind!r}.", stacklevel=2)
    return devices


def mfu_metrics(flops_per_token: float, tokens_per_sec: float, n_devices: int,
                peak: float) -> dict[str, float]:
    """Achieved TFLOP/s per device and model FLOPs utilisation.

    `tokens_per_sec` is the global throughput (all devices); `peak` is FLOP/s per device.
    """
    per_device = flops_per_token * tokens_per_sec / n_devices
    return {"perf/tflops_per_device": per_device / 1e12, "perf/mfu": per_device / peak}
