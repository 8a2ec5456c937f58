"""`launcher=tpu_pod` and `launcher=xpk`: the command that runs this job on every host of a Cloud
TPU VM pod (`gcloud compute tpus tpu-vm ssh --worker=all`) or as a GKE workload (`xpk workload
create`). Each host runs `python -m stack ARGS launcher=none` with STACK_DISTRIBUTED=auto, so
`jax.distributed.initialize()` finds the pod's coordinator by itself (stack.launch.local).
`launcher.dry_run=true` prints the command; otherwise it runs and its exit code is the job's.
Without `launcher.zone` / `launcher.project`, gcloud uses its configured `compute/zone` and
`core/project` (gcloud's own defaults for `tpu-vm ssh`)."""

import shlex
import subprocess
import sys
import time
from typing import Any

from stack.errors import ConfigError

REQUIRED = {"tpu_pod": ("tpu_name",), "xpk": ("cluster", "tpu_type", "docker_image")}


def remote_command(launcher: Any, argv: list[str]) -> str:
    """The shell command every host runs: the user's arguments with the launcher off."""
    args = [a for a in argv if not a.startswith("launcher")] + ["launcher=none"]
    env = ["STACK_DISTRIBUTED=auto", *launcher.env]
    return " ".join([*env, "python", "-m", "stack", *map(shlex.quote, args)])


def cloud_command(launcher: Any, argv: list[str]) -> list[str]:
    """The gcloud / xpk command line of `launcher` for the job `argv`."""
    missing = [k for k in REQUIRED[launcher.name] if not launcher[k]]
    if missing:
        raise ConfigError(f"launcher={launcher.name} needs {', '.join(f'launcher.{k}' for k in missing)} "
                          f"(required: {', '.join(REQUIRED[launcher.name])}); see conf/launcher/{launcher.name}.yaml.")
    remote = remote_command(launcher, argv)
    if launcher.name == "tpu_pod":
        where = [f"--{k}={launcher[k]}" for k in ("zone", "project") if launcher[k]]
        return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", launcher.tpu_name, *where,
                "--worker=all", f"--command=cd {launcher.workdir} && {remote}"]
    workload = launcher.workload or time.strftime("stack-%Y%m%d-%H%M%S")
    return ["xpk", "workload", "create", f"--cluster={launcher.cluster}", f"--workload={workload}",
            f"--tpu-type={launcher.tpu_type}", f"--num-slices={launcher.num_slices}",
            f"--docker-image={launcher.docker_image}", f"--command={remote}"]


def launch_cloud(launcher: Any, argv: list[str]) -> int:
    """Print (dry run) or run the command; the exit code."""
    command = cloud_command(launcher, argv)
    print(shlex.join(command), flush=True)
    if launcher.dry_run:
        return 0
    return subprocess.run(command, stdout=sys.stdout, stderr=sys.stderr).returncode
