"""`hydra/launcher=slurm` (hydra-submitit-launcher + submitit): each job is a SLURM job of
`nodes` x `tasks_per_node` tasks, every task runs the same Hydra job, and the tasks of a job
become one JAX program. The rank mapping (`submitit_ranks`) reads submitit's JobEnvironment
(SLURM_* on a cluster, SUBMITIT_LOCAL_* under `hydra/launcher=submitit_local`): coordinator =
the job's first host, a port derived from the job id, number of processes = its tasks,
process id = the task's global rank; it exports them as the STACK_* variables that
`stack.launch.local.init_distributed` passes to `jax.distributed.initialize`.
"""

import os
import shutil
import zlib
from typing import Any

from hydra.core.config_store import ConfigStore

from stack.errors import ConfigError


def submitit_ranks() -> tuple[str, int, int] | None:
    """(coordinator host:port, processes, this process's id) of a submitit job of > 1 task."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    import submitit  # only inside a submitit job (it set the variable tested above)

    env = submitit.JobEnvironment()
    if env.num_tasks < 2:
        return None
    port = 20000 + zlib.crc32(env.job_id.encode()) % 20000  # the same in every task of the job
    return f"{env.hostnames[0]}:{port}", env.num_tasks, env.global_rank


def export_ranks() -> None:
    """Set STACK_COORDINATOR / NUM_PROCESSES / PROCESS_ID from submitit's environment, if any."""
    ranks = submitit_ranks()
    if ranks is not None and not os.environ.get("STACK_COORDINATOR"):
        coordinator, n, rank = ranks
        os.environ.update(STACK_COORDINATOR=coordinator, STACK_NUM_PROCESSES=str(n), STACK_PROCESS_ID=str(rank))


def check_submit_host(overrides: list[str]) -> None:
    """`hydra/launcher=slurm` away from SLURM (no `srun` on PATH, which submitit requires): one
    paragraph instead of submitit's traceback."""
    if "hydra/launcher=slurm" in overrides and shutil.which("srun") is None:
        raise ConfigError("hydra/launcher=slurm submits each job to SLURM (sbatch), but this machine has no 'srun' "
                          "on PATH: run the command on the cluster's login node. On this machine the same sweep "
                          "runs with hydra/launcher=joblib (parallel jobs here) or hydra/launcher=submitit_local.")


def register_slurm() -> None:
    """`hydra/launcher=slurm`: submitit's SLURM launcher with a multi-node template's defaults
    (one task per node: each task drives all of its node's devices)."""
    try:
        from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf  # optional plugin
    except ImportError:  # hydra-submitit-launcher not installed
        return
    node: Any = SlurmQueueConf(tasks_per_node=1, nodes=1, timeout_min=60 * 24, signal_delay_s=120,
                               max_num_timeout=3)
    ConfigStore.instance().store(group="hydra/launcher", name="slurm", node=node, provider="stack")
