"""AOT compile time of the real train step for a TPU slice, from this CPU machine.

    python bench/aot_compile.py                      # llama3_8b on v5e-8 (v5e:2x4), fsdp
    python bench/aot_compile.py model=llama3_1b      # any extra Hydra overrides

Needs libtpu (`pip install -e ".[tpu]"`). Prints the seconds of each phase: the topology
(libtpu's compile-only devices), the shape-only build, the abstract run (state, data), jax's lowering to
StableHLO and XLA:TPU's compile, then the per-device memory of the compiled step.
"""

import sys
import time

from hydra import compose, initialize_config_module
from rows import emit  # bench/ is on sys.path when run as a script

DEFAULT = ["model=llama3_8b", "hardware=tpu_v5e", "hardware.topology=v5e:2x4",
           "mesh=fsdp", "mode=compile"]
GiB = 1024**3


def main(overrides: list[str]) -> None:
    t0 = time.perf_counter()
    from stack.engine.aot import abstract_run, lower_and_compile, target_devices
    from stack.hardware.mesh import bytes_per_device
    from stack.run.build import build

    with initialize_config_module("stack.conf", version_base=None):
        cfg = compose("config", overrides=DEFAULT + overrides)
    t_import = time.perf_counter()
    devices = target_devices(cfg.hardware)
    t_topo = time.perf_counter()
    exp = build(cfg, run_dir="", abstract=True, devices=devices)
    t_build = time.perf_counter()
    state = abstract_run(exp)
    t_state = time.perf_counter()
    r, _ = lower_and_compile(exp, state)
    print(f"{cfg.model.name} on {cfg.hardware.topology} ({len(devices)} chips), mesh {dict(exp.mesh.shape)}, "
          f"batch {cfg.data.batch_size}x{cfg.data.seq_len}")
    print(f"  import + compose   {t_import - t0:7.1f} s")
    print(f"  topology (libtpu)  {t_topo - t_import:7.1f} s")
    print(f"  build (abstract)   {t_build - t_topo:7.1f} s")
    print(f"  abstract state     {t_state - t_build:7.1f} s")
    print(f"  lower              {r.lower_seconds:7.1f} s")
    print(f"  compile            {r.compile_seconds:7.1f} s")
    print(f"  total              {time.perf_counter() - t0:7.1f} s")
    print(f"per device: state {bytes_per_device(state.state) / GiB:.2f} GiB, arguments "
          f"{r.argument_bytes / GiB:.2f} GiB, temp {r.temp_bytes / GiB:.2f} GiB, code {r.code_bytes / GiB:.2f} GiB, "
          f"total {r.total_bytes / GiB:.2f} GiB of {cfg.hardware.hbm_bytes_per_chip / GiB:.2f} GiB; "
          f"{r.flops:.3e} FLOPs per step")
    emit(f"{cfg.model.name} on {cfg.hardware.topology}: per-device memory / HBM",
         r.total_bytes / cfg.hardware.hbm_bytes_per_chip, "<= 1.0")


if __name__ == "__main__":
    main(sys.argv[1:])
