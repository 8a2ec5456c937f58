"""The CPU host-memory preflight: sizes against a hand count of Llama 3 8B, and the available
memory read from meminfo and cgroup files."""

import pytest
from flax import nnx

from stack.errors import ConfigError
from stack.hardware.host_fit import GiB, available_bytes, check_host_memory
from stack.models.init import abstract_model
from stack.optim.chain import make_optimizer
from tests.helpers import make_cfg

# Llama 3 8B by hand: embed + untied head 2 x 128256 x 4096; per layer q, o 4096^2, k, v 4096 x 1024,
# the MLP 3 x 4096 x 14336 and two norms; 32 layers and the final norm
LLAMA3_8B = 2 * 128256 * 4096 + 32 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 4096


def test_llama3_8b_is_refused_with_its_training_state_and_adapters_count_the_weights_only():
    cfg = make_cfg(["model=llama3_8b"])
    params, (tx, _) = nnx.state(abstract_model(cfg.model), nnx.Param), make_optimizer(cfg.optimizer)
    fp32 = f"{LLAMA3_8B * 4 / GiB:.1f}"  # 29.9
    with pytest.raises(ConfigError, match=rf"needs at least {LLAMA3_8B * 16 / GiB:.1f} GiB .* \(parameters {fp32} "
                                          rf"GiB, their gradients {fp32} GiB, the optimizer's state 59\.8 GiB\), .* "
                                          r"has 23\.0 GiB available"):
        check_host_memory("llama3_8b", params, tx, True, 23 * GiB)
    check_host_memory("llama3_8b", params, tx, False, 31 * GiB)  # LoRA: the weights alone fit
    with pytest.raises(ConfigError, match=rf"\(parameters {fp32} GiB\)"):
        check_host_memory("llama3_8b", params, tx, False, 29 * GiB)
    check_host_memory("llama3_8b", params, tx, True, None)  # unknown: not refused


def test_available_memory_is_meminfo_capped_by_the_cgroup(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 4000 kB\nMemAvailable: 1000 kB\n")
    assert available_bytes(str(tmp_path)) == 1_024_000
    v2 = tmp_path / "sys" / "fs" / "cgroup"
    v2.mkdir(parents=True)
    (v2 / "memory.max").write_text("max\n")
    (v2 / "memory.current").write_text("1048576\n")
    assert available_bytes(str(tmp_path)) == 1_024_000  # no limit
    (v2 / "memory.max").write_text("2048000\n")
    assert available_bytes(str(tmp_path)) == 2_048_000 - 1_048_576
    (v2 / "memory.max").unlink()
    (v2 / "memory").mkdir()
    (v2 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    (v2 / "memory" / "memory.usage_in_bytes").write_text("5\n")
    assert available_bytes(str(tmp_path)) == 1_024_000
    (v2 / "memory" / "memory.limit_in_bytes").write_text("1000005\n")
    assert available_bytes(str(tmp_path)) == 1_000_000


def test_build_refuses_a_model_no_host_holds_before_drawing_its_weights(tmp_path):
    """Llama 3 70B's fp32 training state is ~1 TiB: refused by `build` on any CPU machine."""
    from stack.run.build import build

    with pytest.raises(ConfigError, match=r"model=llama3_70b needs at least 1\d\d\d\.\d GiB of host memory"):
        build(make_cfg(["model=llama3_70b", "checkpoint=none"]), str(tmp_path))
