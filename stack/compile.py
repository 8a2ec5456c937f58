"""`mode=compile`: AOT-compile the real train step for the target hardware, from this machine.

For TPU targets the devices come from `jax.experimental.topologies` (compile-only devices
of `hardware.topology`, made by libtpu: no TPU needed; multi-host slices from one CPU
process). The experiment is built shape-only on them (`build(..., devices=...)`) and
`stack.loop.jit_steps`'s train step is lowered for abstract params, optimizer state and
batch carrying the shardings training uses, then compiled. XLA's memory and cost analyses
give the per-device footprint (vs the chip's HBM) and FLOPs (vs the chip's peak).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Any

import jax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from stack.build import Experiment, build
from stack.errors import ConfigError
from stack.hardware import check_platform, train_flops_per_token
from stack.loop import jit_steps
from stack.parallel import _on, batch_sharding, opt_state_shardings
from stack.precompute import columns_fn

GiB = 1024**3
SINGLE_HOST_CHIPS = {"v5e": 8, "v6e": 8}  # largest one-host slice (v5litepod-8, v6e-8); others 4


@dataclass
class CompileReport:
    """Per-device numbers of one compiled train step (bytes, FLOPs) and the compile times."""

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    code_bytes: int
    xla_peak_bytes: int | None  # CompiledMemoryStats.peak_memory_in_bytes, where reported
    flops: float  # XLA cost analysis of the partitioned (per-device) program
    lower_seconds: float
    compile_seconds: float

    @property
    def total_bytes(self) -> int:
        """Inputs + outputs not aliased to donated inputs + temporaries + code, or XLA's peak if larger."""
        total = self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes
        return max(total, self.xla_peak_bytes or 0)


def host_bounds(topology: str) -> tuple[int, ...] | None:
    """`chips_per_host_bounds` for `topology` ("v5e:2x4"): the whole slice when it fits on one
    host, else None (libtpu's default 2x2x1: the 4-chip hosts of multi-host slices)."""
    gen, _, shape = topology.partition(":")
    dims = [int(d) for d in shape.split("x")]
    return tuple(dims + [1] * (3 - len(dims))) if math.prod(dims) <= SINGLE_HOST_CHIPS.get(gen, 4) else None


def target_devices(hw: Any) -> list[jax.Device]:
    """Compile-only devices of a TPU topology, or the local devices of other platforms."""
    if hw.platform != "tpu":
        if hw.platform == "gpu" and not any(d.platform == "gpu" for d in jax.devices()):
            raise ConfigError(f"mode=compile for hardware={hw.name} needs a GPU here: compiling "
                              "from a machine without the target works for TPU targets only.")
        return check_platform(hw)
    if importlib.util.find_spec("libtpu") is None:
        raise ConfigError(
            f"mode=compile for hardware={hw.name} (topology {hw.topology}) needs libtpu, the TPU "
            f'compiler, which is not installed. Install the extra: pip install -e ".[tpu]" '
            f'(that is, pip install "jax[tpu]=={jax.__version__}"), best in a separate venv.')
    if not hw.topology:
        raise ConfigError(f"'hardware.topology' is not set for hardware={hw.name}; set e.g. v5e:2x2.")
    if not (os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio")):  # not on a TPU VM
        for key, value in (("TPU_SKIP_MDS_QUERY", "1"), ("TPU_WORKER_HOSTNAMES", "localhost"),
                           ("TPU_ACCELERATOR_TYPE", f"{hw.topology.split(':')[0]}-{hw.chips}"),
                           ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")):  # no chip to guard with a lockfile
            os.environ.setdefault(key, value)  # else libtpu prints errors as it loads
    from jax.experimental import topologies

    kwargs = {"chips_per_host_bounds": b} if (b := host_bounds(hw.topology)) else {}
    try:
        topo = topologies.get_topology_desc(topology_name=hw.topology, platform="tpu", **kwargs)
    except Exception as exc:
        raise ConfigError(f"libtpu cannot make hardware.topology={hw.topology!r}: {exc}") from exc
    if len(topo.devices) != hw.chips:
        raise ConfigError(f"hardware.topology={hw.topology!r} has {len(topo.devices)} chips but "
                          f"hardware.chips={hw.chips}; make them agree.")
    return list(topo.devices)


def _sds(tree: Any, mesh: Any) -> Any:
    """`tree`'s leaves as ShapeDtypeStructs laid out on `mesh` as training lays them out."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=_on(mesh, x)), tree)


def abstract_state(exp: Experiment) -> tuple[Any, Any, Any]:
    """(trained params, optimizer state, the rest of the model's state) as ShapeDtypeStructs
    with the shardings training uses."""
    _, params, fixed = nnx.split(exp.model, exp.trainable, ...)
    opt_shardings = opt_state_shardings(exp.tx, params, exp.mesh)  # eager: not on the target mesh
    opt_state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                             jax.eval_shape(exp.tx.init, params), opt_shardings)
    return _sds(params, exp.mesh), opt_state, _sds(fixed, exp.mesh)


def bytes_per_device(tree: Any) -> int:
    """Bytes of the largest shard of every ShapeDtypeStruct leaf of `tree`, summed."""
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def lower_and_compile(exp: Experiment, params: Any, opt_state: Any, fixed: Any) -> CompileReport:
    """AOT-compile `exp`'s train step (`jit_steps`) for abstract inputs and measure it."""
    mesh, data = exp.mesh, batch_sharding(exp.mesh, exp.rules)
    on_data = lambda v: jax.ShapeDtypeStruct(  # noqa: E731
        v.shape, v.dtype, sharding=NamedSharding(mesh, PartitionSpec(*data.spec[:v.ndim])))
    batch = {k: on_data(v) for k, v in exp.eval_batches[0].items()}
    frozen = _sds(exp.algorithm.frozen(exp.model), mesh)
    with jax.set_mesh(mesh), nnx.logical_axis_rules(exp.rules):
        if exp.algorithm.precomputes:  # the step reads precomputed columns instead of the frozen state
            columns = jax.eval_shape(columns_fn(exp, nnx.graphdef(exp.model)), params, fixed, batch, frozen)
            batch, frozen = {**batch, **jax.tree.map(on_data, columns)}, None
        step_fn, _ = jit_steps(exp, (jax.tree.map(lambda x: x.sharding, params),
                                     jax.tree.map(lambda x: x.sharding, opt_state)))
        t0 = time.perf_counter()
        lowered = step_fn.lower(params, opt_state, fixed, batch, frozen)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
    mem, cost = compiled.memory_analysis(), compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    return CompileReport(mem.argument_size_in_bytes, mem.output_size_in_bytes, mem.alias_size_in_bytes,
                         mem.temp_size_in_bytes, mem.generated_code_size_in_bytes,
                         getattr(mem, "peak_memory_in_bytes", None), float(cost.get("flops", 0.0)), t1 - t0, t2 - t1)


def _size(b: float, unit: str = "") -> str:
    """`b` bytes in GiB (MiB for small sizes unless `unit` is "GiB")."""
    return f"{b / GiB:.2f} GiB" if b >= GiB / 10 else f"{b / GiB:.3g} GiB" if unit else f"{b / 2**20:.2f} MiB"


def _does_not_fit(used: float, hbm: float, why: str = "") -> int:
    print(f"does not fit: {_size(used, 'GiB')} > {_size(hbm, 'GiB')}{why}")
    return 1


def compile_for_target(cfg: Any) -> int:
    """`mode=compile`: print the compiled step's per-device memory, FLOPs and predicted step
    time; return 0 when it fits the chip's HBM (or no HBM size is known), 1 when it does not."""
    hw, hbm = cfg.hardware, cfg.hardware.hbm_bytes_per_chip
    exp = build(cfg, run_dir="", abstract=True, devices=target_devices(hw))
    n, hosts = exp.mesh.devices.size, len({d.process_index for d in exp.mesh.devices.flat})
    print(f"mode=compile: model={cfg.model.name} on hardware={hw.name} ("
          f"{hw.topology + ', ' if hw.platform == 'tpu' else ''}{n} device(s), {hosts} host(s)), "
          f"mesh={cfg.mesh.name} {dict(exp.mesh.shape)}, batch {cfg.data.batch_size}x{cfg.data.seq_len}")
    if n < hw.chips:
        print(f"note: mesh={cfg.mesh.name} uses {n} of the {hw.chips} chips; mesh={hw.default_mesh} uses them all")
    params, opt_state, fixed = abstract_state(exp)
    state = bytes_per_device((params, opt_state, fixed))
    print(f"per device: parameters + optimizer state {_size(state)}")
    if hbm and state > hbm:  # no need to spend minutes compiling
        return _does_not_fit(state, hbm, " (parameters + optimizer state alone; not compiled)")
    try:
        r = lower_and_compile(exp, params, opt_state, fixed)
    except jax.errors.JaxRuntimeError as exc:  # XLA:TPU refuses programs that exceed HBM
        if "RESOURCE_EXHAUSTED" not in str(exc):
            raise
        print(f"XLA: {str(exc).splitlines()[0]}")
        need = [float(x) * GiB for x in re.findall(r"([\d.]+)G\b", str(exc))[:1]]
        return _does_not_fit(max(need + [state]), hbm or 0, " (the compiler ran out of HBM)")
    print(f"lower {r.lower_seconds:.1f}s, compile {r.compile_seconds:.1f}s")
    print(f"per device: arguments {_size(r.argument_bytes)} | outputs {_size(r.output_bytes)} "
          f"(aliased to donated inputs {_size(r.alias_bytes)}) | temp {_size(r.temp_bytes)} | "
          f"code {_size(r.code_bytes)}" + (f" | XLA peak {_size(r.xla_peak_bytes)}" if r.xla_peak_bytes else ""))
    share = f" of {_size(hbm)} HBM ({r.total_bytes / hbm:.0%})" if hbm else " (no HBM size in the config)"
    print(f"per device total: {_size(r.total_bytes)}{share}")
    model_flops = train_flops_per_token(cfg.model, cfg.data.seq_len) * exp.algorithm.batch_tokens(exp.eval_batches[0]) / n
    line = f"FLOPs per device per step: {r.flops:.3e} (XLA), {model_flops:.3e} (model formula)"
    if hw.peak_flops_per_chip:
        line += (f"; predicted step time at the peak {hw.peak_flops_per_chip / 1e12:.0f} TFLOP/s: "
                 f"{r.flops / hw.peak_flops_per_chip * 1e3:.3g} ms (100% MFU, a lower bound)")
    print(line)
    if hbm and r.total_bytes > hbm:
        return _does_not_fit(r.total_bytes, hbm)
    print(f"fits: {_size(r.total_bytes, 'GiB')} <= {_size(hbm, 'GiB')}" if hbm else "fits: no HBM size to check against")
    return 0
