"""Compile-only GPU targets (stack.hardware.gpu_target): the topology of N GPUs and the errors that name
what is missing. The compile itself runs in the gpu-aot extra's venv (tests/recipes/test_real_size.py)."""

import pytest

from stack.errors import ConfigError
from stack.hardware.gpu_target import gpu_devices, gpu_topology, plugin_installed
from tests.helpers import make_cfg


def test_gpus_fill_hosts_of_eight():
    assert [gpu_topology(n) for n in (1, 2, 8, 16, 64)] == ["1x1x1", "1x1x2", "1x1x8", "1x2x8", "1x8x8"]
    with pytest.raises(ConfigError, match=r"'hardware.chips'=12 .* multiple"):
        gpu_topology(12)


def test_an_undescribed_gpu_is_named_with_the_described_ones():
    with pytest.raises(ConfigError, match=r"device_kind='NVIDIA H200'.*described: \['NVIDIA H100 80GB HBM3'\]"):
        gpu_devices(make_cfg(["hardware=gpu_h200"]).hardware)


@pytest.mark.skipif(plugin_installed(), reason="the CUDA plugin is installed here: the gpu-aot venv compiles instead")
def test_without_the_cuda_plugin_the_error_names_the_extra():
    with pytest.raises(ConfigError, match=r'hardware=gpu_h100 needs the CUDA compiler plugin.*"\.\[gpu-aot\]"'):
        gpu_devices(make_cfg(["hardware=gpu_h100", "hardware.chips=8"]).hardware)
