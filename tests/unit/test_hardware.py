"""Hardware targets: config options, the MaxText FLOP formula, device checks, CPU peak, MFU."""

import json
import os
import subprocess
import sys
import warnings

import pytest

from stack.errors import ConfigError
from stack.hardware import platform as hardware
from tests.helpers import make_cfg

OPTIONS = ["cpu", "gpu_h100", "gpu_h200", "tpu_v5e", "tpu_v5p", "tpu_v6e"]
GiB = 2**30


@pytest.mark.parametrize("name", OPTIONS)
def test_every_hardware_option_composes(name):
    hw = make_cfg([f"hardware={name}"]).hardware
    assert hw.name == name
    assert hw.platform in ("cpu", "gpu", "tpu")
    assert hw.chips >= 1
    assert hw.param_dtype == "float32"
    if name == "cpu":
        assert hw.peak_flops_per_chip is None and hw.dtype == "float32"
        return
    assert hw.peak_flops_per_chip > 1e14 and hw.hbm_bytes_per_chip > 1e10
    assert hw.dtype == "bfloat16" and hw.device_kind
    if hw.platform == "tpu":
        assert hw.topology.startswith(name.split("_")[1] + ":") and hw.chips == 4
        assert hw.default_mesh == "fsdp"
    else:
        assert hw.topology is None and hw.chips == 1 and hw.default_mesh == "single"


def test_published_numbers():
    hw = {n: make_cfg([f"hardware={n}"]).hardware for n in OPTIONS[1:]}
    assert hw["tpu_v5e"].peak_flops_per_chip == 197e12 and hw["tpu_v5e"].hbm_bytes_per_chip == 16 * GiB
    assert hw["tpu_v5p"].peak_flops_per_chip == 459e12 and hw["tpu_v5p"].hbm_bytes_per_chip == 95 * GiB
    assert hw["tpu_v6e"].peak_flops_per_chip == 918e12 and hw["tpu_v6e"].hbm_bytes_per_chip == 32 * GiB
    assert hw["gpu_h100"].peak_flops_per_chip == 989.4e12 and hw["gpu_h100"].hbm_bytes_per_chip == 80e9
    assert hw["gpu_h200"].peak_flops_per_chip == 989.4e12 and hw["gpu_h200"].hbm_bytes_per_chip == 141e9


def _maxtext_per_token(m, seq_len, batch=3):
    """MaxText's dense-branch per-device-step formula, spelled out, divided by B·S."""
    B, S, E, F, V, L = batch, seq_len, m.d_model, m.d_ff, m.vocab_size, m.n_layers
    H, KV, D = m.n_heads, m.n_kv_heads, m.head_dim or m.d_model // m.n_heads
    ffn = 2 * B * S * F * E * 2 + 2 * B * S * F * E  # mlp_activations = ["silu", "linear"]
    qkv = 2 * B * S * E * (H + 2 * KV) * D
    proj = 2 * B * S * E * H * D
    causal = 4 * B * S**2 * H * D / 2
    embedding = 2 * B * S * E * V
    total = ((ffn + qkv + proj) * L + embedding) * 3 + causal * L * 3
    return total / (B * S)


def test_flops_llama_tiny_by_hand():
    m = make_cfg(["model=llama_tiny"]).model  # V=384 E=64 L=2 H=4 KV=2 D=16 F=176
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 176  # q, k+v, o, gate/up/down
    n = 2 * per_layer + 384 * 64  # + lm_head
    assert n == 116_736 == hardware.matmul_params(m)
    attention = 6 * 2 * 4 * 16 * 128  # 6·L·H·D·S (causal half of 12·L·H·D·S)
    assert hardware.train_flops_per_token(m, 128) == 6 * n + attention == 798_720
    assert hardware.train_flops_per_token(m, 128) == pytest.approx(_maxtext_per_token(m, 128))


def test_flops_llama3_8b():
    m = make_cfg(["model=llama3_8b"]).model
    total, embedding, norms = 8_030_261_248, 128_256 * 4096, (2 * 32 + 1) * 4096
    n = hardware.matmul_params(m)
    assert n == total - embedding - norms == 7_504_658_432  # lm_head included, lookup not
    f = hardware.train_flops_per_token(m, 8192)
    assert f == 6 * n + 6 * 32 * 32 * 128 * 8192 == 51_470_401_536
    assert f == pytest.approx(_maxtext_per_token(m, 8192))


def test_flops_of_a_sliding_layer_count_its_window():
    """Gemma 3 tiny: a sliding layer (W = 8) and a global one over S = 128: W − W²/2S = 7.75 keys per
    query (the continuous form of the causal S/2) and 64."""
    m = make_cfg(["model=gemma3"]).model  # H=4 D=32
    attention = 3 * 4 * 4 * 32 * (8 - 64 / 256 + 64)
    assert hardware.train_flops_per_token(m, 128) == 6 * hardware.matmul_params(m) + attention
    assert hardware.train_flops_per_token(m, 4) == hardware.train_flops_per_token(make_cfg(  # W > S: no window
        ["model=gemma3", "model.sliding_window=null", "model.layer_types=null"]).model, 4)


def test_flops_of_routed_experts_count_the_active_ones():
    """Qwen3 30B-A3B: per layer the router (D·E) and the 8 experts a token reaches (3·D·F each), by hand."""
    m = make_cfg(["model=qwen3_30b_a3b"]).model  # D 2048, 32 heads / 4 kv of 128, E 128, k 8, F 768
    attn = 2048 * (32 + 2 * 4) * 128 + 32 * 128 * 2048
    experts = 2048 * 128 + 8 * 3 * 2048 * 768
    assert hardware.matmul_params(m) == 48 * (attn + experts) + 151_936 * 2048 == 3_041_656_832


def test_flops_tied_embeddings_count_output_once():
    m = make_cfg(["model=llama3_1b"]).model  # Llama 3.2 1B: 1,235,814,400 params, tied
    assert hardware.matmul_params(m) == 1_235_814_400 - (2 * 16 + 1) * 2048


def test_missing_platform_error():
    hw = make_cfg(["hardware=tpu_v5e"]).hardware
    with pytest.raises(ConfigError) as e:
        hardware.check_platform(hw)
    msg = str(e.value)
    for part in ("tpu_v5e", "tpu", "v5e:2x2", "TPU v5 lite", "4 tpu", "cpu", "hardware=cpu",
                 "mode=compile", ".[tpu]"):
        assert part in msg, (part, msg)
    assert "\n" not in msg


def test_cpu_platform_ok_and_warnings():
    hw = make_cfg(["hardware=cpu"]).hardware
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        devices = hardware.check_platform(hw)
    assert devices and devices[0].platform == "cpu"
    hw = make_cfg(["hardware=cpu", "hardware.chips=4096", "hardware.device_kind=TPU v5 lite"]).hardware
    with pytest.warns(UserWarning) as rec:
        hardware.check_platform(hw)
    text = " ".join(str(w.message) for w in rec)
    assert "only" in text and "TPU v5 lite" in text


def test_cpu_peak_probe_and_cache(tmp_path, monkeypatch):
    path = str(tmp_path / "cache" / "cpu_peak-host.json")
    monkeypatch.setattr(hardware, "machine_busy", lambda: False)
    monkeypatch.setattr(hardware, "cores_used_by_others", lambda since: 0.0)  # other test workers may run
    peak = hardware.measure_cpu_peak(path)
    assert peak > 1e8
    assert json.load(open(path)) == pytest.approx({"flops_per_sec": peak, "n": 1024, "repeats": 5, "busy": False,
                                                   "dtype": "float32", "cpu_count": os.cpu_count(),
                                                   "seconds": 2 * 1024**3 / peak, "version": hardware.PROBE_VERSION})
    assert hardware.measure_cpu_peak(path) == peak  # read back, not re-measured
    cpu = make_cfg(["hardware=cpu"]).hardware
    assert (hardware.peak_flops_per_device(cpu, path) == peak
            and hardware.peak_flops_per_device(cpu, path, 8) == peak / 8)
    assert hardware.peak_flops_per_device(make_cfg(["hardware=tpu_v6e"]).hardware, None) == 918e12


def test_a_cpu_peak_probed_on_a_busy_machine_is_measured_again_once_it_is_idle(tmp_path, monkeypatch):
    path = str(tmp_path / "cpu_peak-host.json")
    with open(path, "w") as f:
        # an understated probe, marked busy
        json.dump({"flops_per_sec": 1.0, "busy": True, "version": hardware.PROBE_VERSION}, f)
    monkeypatch.setattr(hardware, "machine_busy", lambda: True)
    assert hardware.measure_cpu_peak(path) == 1.0  # still busy: a new probe would be no better
    monkeypatch.setattr(hardware, "machine_busy", lambda: False)
    monkeypatch.setattr(hardware, "cores_used_by_others", lambda since: 0.0)
    peak = hardware.measure_cpu_peak(path)
    assert peak > 1e8 and json.load(open(path))["busy"] is False
    assert hardware.measure_cpu_peak(path) == peak


def test_a_cpu_peak_cached_by_an_older_probe_is_measured_again(tmp_path, monkeypatch):
    """Version 1 probes ran in build, beside stack.engine.precompile's compile in the same process: low."""
    path = str(tmp_path / "cpu_peak-host.json")
    with open(path, "w") as f:
        json.dump({"flops_per_sec": 1.0, "busy": False}, f)  # no version: 1
    monkeypatch.setattr(hardware, "machine_busy", lambda: False)
    monkeypatch.setattr(hardware, "cores_used_by_others", lambda since: 0.0)
    peak = hardware.measure_cpu_peak(path)
    assert peak > 1e8 and json.load(open(path))["version"] == hardware.PROBE_VERSION


@pytest.mark.skipif(hardware.cpu_clock() is None, reason="reads Linux's /proc/stat")
def test_a_probe_beside_processes_that_keep_every_core_busy_is_marked_busy(tmp_path, monkeypatch):
    """The load average is a minute behind: a probe taken as a pip install started read 110 of
    209 GFLOP/s and was kept as idle. One spinning process per core runs during this probe."""
    monkeypatch.setattr(hardware, "machine_busy", lambda: False)  # the load average has not risen yet
    spin = "print(flush=True)\nwhile True: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE) for _ in range(os.cpu_count())]
    try:
        for p in spinners:
            p.stdout.readline()  # spinning
        path = str(tmp_path / "cpu_peak-host.json")
        hardware.measure_cpu_peak(path)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
            p.stdout.close()
    with open(path) as f:
        assert json.load(f)["busy"] is True


def test_mfu_metrics():
    out = hardware.mfu_metrics(flops_per_token=6e9, tokens_per_sec=4e4, n_devices=4, peak=197e12)
    assert out["perf/tflops_per_device"] == pytest.approx(60.0)  # 6e9·4e4/4 = 6e13
    assert out["perf/mfu"] == pytest.approx(6e13 / 197e12)
    assert set(out) == {"perf/tflops_per_device", "perf/mfu"}
