"""launcher=tpu_pod / xpk: the exact gcloud and xpk command lines (dry runs), checked against
the commands written out by hand from the gcloud and xpk docs."""

import pytest

from stack.errors import ConfigError
from stack.launch.cloud import cloud_command
from stack.launch.local import launcher_for
from tests.helpers import make_cfg

JOB = ["+recipe=llama_dpo", "hardware=tpu_v5e", "algorithm.beta=0.2", "trainer.objective=eval/rewards/margins"]


def command(overrides: list[str]) -> list[str]:
    cfg = make_cfg(JOB + overrides)
    return cloud_command(cfg.launcher, JOB + overrides)


def test_tpu_pod_runs_the_job_on_every_worker():
    got = command(["launcher=tpu_pod", "launcher.tpu_name=my-v5e-32", "launcher.zone=us-west4-a",
                   "launcher.project=proj", "launcher.env=['WANDB_MODE=online']", "launcher.dry_run=true"])
    assert got == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-v5e-32", "--zone=us-west4-a", "--project=proj",
                   "--worker=all", "--command=cd ~/stack && STACK_DISTRIBUTED=auto WANDB_MODE=online python -m stack "
                   "+recipe=llama_dpo hardware=tpu_v5e algorithm.beta=0.2 trainer.objective=eval/rewards/margins "
                   "launcher=none"]


def test_xpk_creates_one_workload():
    got = command(["launcher=xpk", "launcher.cluster=c1", "launcher.tpu_type=v5litepod-16", "launcher.num_slices=2",
                   "launcher.docker_image=gcr.io/me/stack:1", "launcher.workload=dpo-1", "logger.project='my runs'"])
    assert got == ["xpk", "workload", "create", "--cluster=c1", "--workload=dpo-1", "--tpu-type=v5litepod-16",
                   "--num-slices=2", "--docker-image=gcr.io/me/stack:1",
                   "--command=STACK_DISTRIBUTED=auto python -m stack +recipe=llama_dpo hardware=tpu_v5e "
                   "algorithm.beta=0.2 trainer.objective=eval/rewards/margins 'logger.project='\"'\"'my runs'\"'\"'' "
                   "launcher=none"]


def test_tpu_pod_without_zone_leaves_it_to_gcloud_config():
    """Issue 17's command names no zone: gcloud then uses its configured compute/zone."""
    got = command(["launcher=tpu_pod", "launcher.tpu_name=my-v5e-32", "launcher.dry_run=true"])
    assert got[:7] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-v5e-32", "--worker=all"]
    assert not any(a.startswith(("--zone", "--project")) for a in got)


@pytest.mark.parametrize("launcher,missing", [("tpu_pod", "launcher.tpu_name"),
                                              ("xpk", "launcher.cluster, launcher.tpu_type, launcher.docker_image")])
def test_a_cloud_launcher_names_what_it_lacks(launcher, missing):
    cfg = make_cfg(JOB + [f"launcher={launcher}"])
    with pytest.raises(ConfigError, match=f"launcher={launcher} needs {missing}"):
        launcher_for(cfg, JOB + [f"launcher={launcher}"])


def test_no_launcher_runs_here_and_local_refuses_a_sweep():
    assert launcher_for(make_cfg(JOB), JOB) is None
    with pytest.raises(ConfigError, match="not a sweep"):
        launcher_for(make_cfg(JOB + ["launcher=local"]), ["-m", *JOB, "launcher=local"])
