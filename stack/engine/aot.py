"""`mode=compile`: AOT-compile the real train step for the target hardware, from this machine.

For TPU targets the devices come from `jax.experimental.topologies` (compile-only devices
of `hardware.topology`, made by libtpu: no TPU needed; multi-host slices from one CPU
process); for GPU targets from the CUDA plugin and a description of the GPU (stack.hardware.gpu_target,
with or without a GPU here). The experiment is built shape-only on them (`stack.run.build.build(...,
devices=...)`) and the programs of `stack.engine.step` that training runs (`update`, the train step,
and `collect`; a DPO round runs the two as one program, `collect_update`, reported here as the
two) are lowered for an abstract TrainState, frozen modules and round of data carrying the
shardings training uses, then compiled. XLA's memory and cost analyses give the
per-device footprint (vs the chip's HBM) and FLOPs (vs the chip's peak).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import jax
from flax import nnx

from stack.engine.step import Parts, Programs, TrainState, abstract_frozen, initial_state, make_programs, split_models
from stack.errors import ConfigError
from stack.hardware.gpu_target import gpu_devices
from stack.hardware.mesh import batch_sharding, bytes_per_device
from stack.hardware.platform import check_platform, train_flops_per_token, trained_length
from stack.quant.footprint import footprint

if TYPE_CHECKING:  # experiment -> precompile -> aot: the type only
    from stack.engine.experiment import Experiment

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
    """Compile-only devices of a TPU topology or of GPUs (stack.hardware.gpu_target), or the local CPU devices."""
    if hw.platform == "gpu":
        return gpu_devices(hw)
    if hw.platform != "tpu":
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
    from jax.experimental import topologies  # loads libtpu: after its environment above is set

    kwargs = {"chips_per_host_bounds": b} if (b := host_bounds(hw.topology)) else {}
    try:
        topo = topologies.get_topology_desc(topology_name=hw.topology, platform="tpu", **kwargs)
    except Exception as exc:
        raise ConfigError(f"libtpu cannot make hardware.topology={hw.topology!r}: {exc}") from exc
    if len(topo.devices) != hw.chips:
        raise ConfigError(f"hardware.topology={hw.topology!r} has {len(topo.devices)} chips but "
                          f"hardware.chips={hw.chips}; make them agree.")
    return list(topo.devices)


@dataclass(frozen=True)
class AbstractRun:
    """A run's programs with shape-only inputs laid out as training lays them out."""

    parts: Parts  # the shape-only models, split (stack.engine.step.split_models)
    programs: Programs
    state: TrainState  # ShapeDtypeStructs with shardings
    frozen: Any
    batch: dict[str, jax.ShapeDtypeStruct]  # one round's data [grad_accum x minibatches, B, ...]
    xp: dict[str, jax.ShapeDtypeStruct]  # what collect makes of it
    turn_batch: dict[str, Any] | None = None  # a turn's input, with multi-turn rollouts (`Programs.turn`)


def abstract_run(exp: Experiment) -> AbstractRun:
    """The same `stack.engine.step` programs the trainer runs, for abstract state, frozen modules and data."""
    with jax.set_mesh(exp.mesh), nnx.logical_axis_rules(exp.rules):  # modules setup builds are born sharded
        parts = split_models(exp)
    state = initial_state(exp, parts, abstract=True)
    programs = make_programs(exp, parts, jax.tree.map(lambda x: x.sharding, state))
    sharding = batch_sharding(exp.mesh, exp.rules)
    reads = exp.cfg.trainer.grad_accum * exp.algorithm.schedule.minibatches
    batch = {k: jax.ShapeDtypeStruct((reads, *v.shape), v.dtype, sharding=sharding)
             for k, v in exp.eval_batches[0].items() if v.dtype.kind in "biuf"}
    frozen = abstract_frozen(exp, parts)
    turn_batch = None
    if programs.interact is not None:  # collect reads the rolled-out batch (what `interact` returns)
        batch, turn_batch = exp.algorithm.interaction_specs(batch)
    collect = lambda s, f, b: programs.collect(s, f, b, True)  # noqa: E731
    xp = jax.eval_shape(collect, state.models_only(), frozen, batch)
    if exp.algorithm.finalize is not None:  # what the update reads: the finalized experience
        scores = exp.algorithm.scores_spec(xp) if exp.algorithm.score else None
        xp = jax.eval_shape(lambda x, s, a: programs.finalize(x, s, a)[0], xp, scores, state.algo)
    if exp.algorithm.precomputes:  # the columns ride with the data; no frozen modules in training
        batch, frozen = {**batch, **{k: v for k, v in xp.items() if k not in batch}}, None
    xp = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding), xp)
    return AbstractRun(parts, programs, state, frozen, batch, xp, turn_batch)


def program_report(lowered: Any) -> CompileReport:
    """Compile a lowered program and read XLA's memory and cost analyses."""
    t0 = time.perf_counter()
    compiled = lowered.compile()
    seconds = time.perf_counter() - t0
    mem, cost = compiled.memory_analysis(), compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    return CompileReport(mem.argument_size_in_bytes, mem.output_size_in_bytes, mem.alias_size_in_bytes,
                         mem.temp_size_in_bytes, mem.generated_code_size_in_bytes,
                         getattr(mem, "peak_memory_in_bytes", None), float(cost.get("flops", 0.0)), 0.0, seconds)


def lower_update(exp: Experiment, r: AbstractRun) -> Any:
    """The train step (`update`) lowered for `r`'s abstract inputs."""
    with jax.set_mesh(exp.mesh), nnx.logical_axis_rules(exp.rules):
        return r.programs.update.lower(r.state, r.frozen, r.xp, 0)


class OutOfMemory(Exception):
    """XLA refused to compile `program` for the target: it exceeds the chip's memory."""

    def __init__(self, program: str, message: str):
        super().__init__(f"{program}: {message}")
        self.program, self.message = program, message


def _compiled(program: str, lowered: Any) -> CompileReport:
    try:
        return program_report(lowered)
    except jax.errors.JaxRuntimeError as exc:  # XLA:TPU refuses programs that exceed HBM
        if "RESOURCE_EXHAUSTED" not in str(exc):
            raise
        raise OutOfMemory(program, str(exc).splitlines()[0]) from exc


def lower_and_compile(exp: Experiment, r: AbstractRun) -> tuple[CompileReport, CompileReport]:
    """AOT-compile `exp`'s update and collect programs for abstract inputs and measure them."""
    t0 = time.perf_counter()
    update = lower_update(exp, r)
    collect = turn = None
    with jax.set_mesh(exp.mesh), nnx.logical_axis_rules(exp.rules):
        if exp.algorithm.collect is not None:  # else the batch is the experience: no program
            collect = r.programs.collect.lower(r.state.models_only(), r.frozen, r.batch, True)
        if r.turn_batch is not None:  # a turn of multi-turn rollouts: its own program, run once per turn
            turn = r.programs.turn.lower(r.state.models_only(), r.turn_batch, True)
    lower_seconds = time.perf_counter() - t0
    none = CompileReport(0, 0, 0, 0, 0, None, 0.0, 0.0, 0.0)
    collected = _compiled("collect", collect) if collect is not None else none
    if turn is not None:  # the round's larger program (the turns' FLOPs with the log-probs')
        turned = _compiled("a turn", turn)
        _print_program("per device (a turn of the multi-turn rollouts):", turned)
        _print_program("per device (collect's log-probs of the transcripts):", collected)
        bigger = max(collected, turned, key=lambda c: c.total_bytes)
        collected = replace(bigger, flops=collected.flops + turned.flops * exp.cfg.env.max_turns,
                            compile_seconds=collected.compile_seconds + turned.compile_seconds)
    return replace(_compiled("train step", update), lower_seconds=lower_seconds), collected


def _size(b: float, unit: str = "") -> str:
    """`b` bytes in GiB (MiB for small sizes unless `unit` is "GiB")."""
    return f"{b / GiB:.2f} GiB" if b >= GiB / 10 else f"{b / GiB:.3g} GiB" if unit else f"{b / 2**20:.2f} MiB"


def _does_not_fit(used: float, hbm: float, why: str = "") -> int:
    print(f"does not fit: {_size(used, 'GiB')} > {_size(hbm, 'GiB')}{why}")
    return 1


def _print_program(name: str, r: CompileReport) -> None:
    print(f"{name} arguments {_size(r.argument_bytes)} | outputs {_size(r.output_bytes)} "
          f"(aliased to donated inputs {_size(r.alias_bytes)}) | temp {_size(r.temp_bytes)} | "
          f"code {_size(r.code_bytes)}" + (f" | XLA peak {_size(r.xla_peak_bytes)}" if r.xla_peak_bytes else ""))


def _print_flops(exp: Experiment, update: CompileReport, collect: CompileReport, n: int) -> None:
    cfg, hw = exp.cfg, exp.cfg.hardware
    steps = exp.algorithm.schedule.epochs * exp.algorithm.schedule.minibatches
    tokens = exp.algorithm.batch_tokens(exp.eval_batches[0]) * cfg.trainer.grad_accum
    model_flops = exp.flops_per_token * tokens / n
    line = f"FLOPs per device per step: {update.flops:.3e} (XLA), {model_flops:.3e} (model formula)"
    if not update.flops:
        line += " (XLA:GPU has no cost analysis without the device: the prediction takes the model formula)"
    elif cfg.model.scan_layers:  # XLA's cost analysis counts a while loop's body once
        line += (" (XLA counts the scanned layers once: the update's prediction takes the model formula, "
                 "collect's is low)")
    else:  # 1.0: no recompute; XLA counts the core's and xla's full [T, T] square, the formula its causal half
        square = train_flops_per_token(cfg.model, trained_length(cfg), causal=False) * tokens / n
        line += (f" = {update.flops / model_flops:.3f}x the formula ({update.flops / square:.3f}x with attention's "
                 "full [T, T] square, which XLA counts of the core and xla kernels)")
    if collect.flops:
        line += f"; collect: {collect.flops:.3e} per round of {steps} step(s)"
    if hw.peak_flops_per_chip:
        formula = cfg.model.scan_layers or not update.flops
        per_step = max(update.flops, model_flops if formula else 0.0) + collect.flops / steps
        line += (f"; predicted step time at the peak {hw.peak_flops_per_chip / 1e12:.0f} TFLOP/s: "
                 f"{per_step / hw.peak_flops_per_chip * 1e3:.3g} ms (100% MFU, a lower bound)")
    print(line)


def _by_module(r: AbstractRun) -> str:
    """Per-device trained params (and the optimizer state, which is shaped like them) and frozen
    weights of each module, e.g. `policy 3.7 GiB trained | value ... | reference 3.7 GiB frozen`."""
    size = lambda tree, name: _size(bytes_per_device((tree or {}).get(name, {})))  # noqa: E731
    parts = [f"{name} {size(r.state.params, name)} trained + {size(r.state.rest, name)} not"
             for name in r.state.params]
    parts += [f"{name} {size(r.frozen, name)} frozen" for name in (r.frozen or {})]
    return " | ".join(parts) + " (+ the optimizer state of the trained params)"


def compile_report(exp: Experiment) -> int:
    """`mode=compile` for a shape-only experiment on the target's devices: print the compiled
    programs' per-device memory, FLOPs and predicted step time; return 0 when it fits the chip's
    HBM (or no HBM size is known), 1 when it does not."""
    cfg = exp.cfg
    hw, hbm = cfg.hardware, cfg.hardware.hbm_bytes_per_chip
    n, hosts = exp.mesh.devices.size, len({d.process_index for d in exp.mesh.devices.flat})
    print(f"mode=compile: model={cfg.model.name} on hardware={hw.name} ("
          f"{hw.topology + ', ' if hw.platform == 'tpu' else ''}{n} device(s), {hosts} host(s)), "
          f"mesh={cfg.mesh.name} {dict(exp.mesh.shape)}, batch {cfg.data.batch_size}x{cfg.data.seq_len}")
    if n < hw.chips:
        print(f"note: mesh={cfg.mesh.name} uses {n} of the {hw.chips} chips; mesh={hw.default_mesh} uses them all")
    r = abstract_run(exp)
    state, frozen = bytes_per_device(r.state), bytes_per_device(r.frozen)
    print(f"per device: train state (params, optimizer, rest of the model) {_size(state)} | "
          f"frozen modules {_size(frozen)}")
    print(f"  by module: {_by_module(r)}")
    saved = footprint(exp, r.state)
    if saved:
        print(f"  {saved}")
    if hbm and state + frozen > hbm:  # no need to spend minutes compiling
        return _does_not_fit(state + frozen, hbm, " (train state and frozen modules alone; not compiled)")
    try:
        update, collect = lower_and_compile(exp, r)
    except OutOfMemory as exc:
        print(f"XLA ({exc.program}): {exc.message}")
        sizes = [float(x) * GiB for x in re.findall(r"([\d.]+)G\b", exc.message)]  # XLA: needed, then available
        room = f" available of {_size(hbm, 'GiB')} HBM" if len(sizes) > 1 and hbm else ""
        return _does_not_fit(max(sizes[:1] + [state]), sizes[1] if room else hbm or 0,
                             f"{room} (the compiler ran out of HBM for the {exc.program})")
    print(f"lower {update.lower_seconds:.1f}s, compile {update.compile_seconds + collect.compile_seconds:.1f}s")
    _print_program("per device (train step):", update)
    if exp.algorithm.collect is not None:
        _print_program("per device (collect, once per round):", collect)
    # each program's arguments are what is resident while it runs (collect's: all but the optimizer state)
    total = max(update.total_bytes, collect.total_bytes + bytes_per_device(r.state.opt_state))
    share = f" of {_size(hbm)} HBM ({total / hbm:.0%})" if hbm else " (no HBM size in the config)"
    print(f"per device total: {_size(total)}{share}")
    _print_flops(exp, update, collect, n)
    if hbm and total > hbm:
        return _does_not_fit(total, hbm)
    print(f"fits: {_size(total, 'GiB')} <= {_size(hbm, 'GiB')}" if hbm else "fits: no HBM size to check against")
    return 0
