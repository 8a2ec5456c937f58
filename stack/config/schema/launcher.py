"""Schema of the `launcher` group: how many processes run the job, and where."""

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class LauncherConfig:
    # none: this process runs the job | local: num_processes on this machine | tpu_pod: every host
    # of a Cloud TPU VM pod (gcloud ... ssh --worker=all) | xpk: a GKE workload (xpk workload create)
    name: str = "none"
    num_processes: int = 1  # local: JAX processes over loopback (jax.distributed), one mesh over all
    port: int = 0  # local: the coordinator's port; 0: a free one
    grace_seconds: float = 10.0  # local: after one rank fails, how long the others get to stop
    dry_run: bool = False  # tpu_pod / xpk: print the command instead of running it
    tpu_name: Optional[str] = None  # tpu_pod: the TPU VM (required)
    zone: Optional[str] = None  # tpu_pod: its zone (null: gcloud's compute/zone)
    project: Optional[str] = None  # tpu_pod: the GCP project (null: gcloud's default)
    workdir: str = "~/stack"  # tpu_pod: where the checkout lives on every host
    env: List[str] = field(default_factory=list)  # tpu_pod / xpk: extra KEY=VALUE for the command
    cluster: Optional[str] = None  # xpk: the GKE cluster (required)
    workload: Optional[str] = None  # xpk: the workload name (null: stack-<date>-<time>)
    tpu_type: Optional[str] = None  # xpk: e.g. v5litepod-32 (required)
    num_slices: int = 1  # xpk
    docker_image: Optional[str] = None  # xpk: the image with stack installed (required)
