"""Schema of the `launcher` group: how many processes run the job, and where."""

from dataclasses import dataclass


@dataclass
class LauncherConfig:
    name: str = "none"  # none: this process runs the job | local: num_processes on this machine
    num_processes: int = 1  # local: JAX processes over loopback (jax.distributed), one mesh over all
    port: int = 0  # local: the coordinator's port; 0: a free one
    grace_seconds: float = 10.0  # local: after one rank fails, how long the others get to stop
