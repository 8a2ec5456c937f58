"""XLA:CPU's LLVM optimisation level for a CPU run: -O1 instead of XLA's default -O2.

On XLA:CPU the matmuls are library calls (YNNPACK/Eigen) and the loops LLVM compiles are the
fusions' elementwise work, which runs as fast at -O1, while every program compiles in less time.
-O0 compiles faster still but runs a step markedly slower. Results differ from -O2 in last bits
only (the recipes' per-step losses within 1e-6 relative; DPO's reward accuracy counts margins of
~1e-8 at its first steps, whose signs can flip). A level set in XLA_FLAGS (the default test
tier's -O0) wins. XLA reads its flags once, when the process first compiles: call this before
that.
"""

import os
from typing import Any

LEVEL_FLAG = "--xla_backend_optimization_level"
CPU_LEVEL = 1


def configure_cpu_compiler(cfg: Any) -> None:
    """For a CPU target (`hardware.platform`), add `LEVEL_FLAG`=`CPU_LEVEL` to XLA_FLAGS unless it
    sets a level already."""
    flags = os.environ.get("XLA_FLAGS", "")
    if cfg.hardware.platform == "cpu" and LEVEL_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {LEVEL_FLAG}={CPU_LEVEL}".strip()
