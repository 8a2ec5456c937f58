"""The SLURM rank mapping: submitit's job environment -> the STACK_* variables of
jax.distributed.initialize (coordinator on the first node, one process per task); the sbatch
script `hydra/launcher=slurm` submits."""

import os

import pytest
import submitit
from hydra import compose, initialize_config_module
from hydra.utils import instantiate

from stack.cli.app import preflight
from stack.errors import ConfigError
from stack.launch.slurm import export_ranks, submitit_ranks

SLURM = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "8", "SLURM_PROCID": "5",
         "SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_JOB_NUM_NODES": "4",
         "SLURM_JOB_NODELIST": "gpu[07-09,11]"}


@pytest.fixture
def env(monkeypatch):
    for key in [k for k in os.environ if k.startswith(("SLURM_", "SUBMITIT_", "STACK_"))]:
        monkeypatch.delenv(key)
    for key in ("STACK_COORDINATOR", "STACK_NUM_PROCESSES", "STACK_PROCESS_ID"):
        monkeypatch.setenv(key, "")  # so that what export_ranks sets is undone after the test
    return monkeypatch


def test_a_slurm_task_maps_to_its_jax_process(env):
    for key, value in SLURM.items():
        env.setenv(key, value)
    coordinator, n, rank = submitit_ranks()
    host, port = coordinator.split(":")
    assert (host, n, rank) == ("gpu07", 8, 5) and 20000 <= int(port) < 40000
    env.setenv("SLURM_PROCID", "0")
    assert submitit_ranks()[0] == coordinator  # every task of the job agrees on the coordinator
    env.setenv("SLURM_JOB_ID", "4243")
    assert submitit_ranks()[0] != coordinator  # another job: another port
    export_ranks()
    assert (os.environ["STACK_NUM_PROCESSES"], os.environ["STACK_PROCESS_ID"]) == ("8", "0")


def test_single_task_jobs_and_plain_runs_stay_single_process(env):
    assert submitit_ranks() is None
    for key, value in {**SLURM, "SLURM_NTASKS": "1"}.items():
        env.setenv(key, value)
    assert submitit_ranks() is None
    export_ranks()
    assert not os.environ["STACK_COORDINATOR"]


class Submitted(Exception):
    """Raised where submitit would call sbatch: the script it would submit is captured."""


def test_the_slurm_launcher_writes_a_multi_node_sbatch_array(env, tmp_path):
    """`-m ... hydra/launcher=slurm hydra.launcher.nodes=4 hydra.launcher.partition=gpu`, a 2-job
    sweep, through the real hydra-submitit-launcher and submitit up to the sbatch call: one job
    array of 2, each 4 nodes x 1 task (one JAX process a node), with submitit's srun command and
    the SUBMITIT_EXECUTOR that stack.launch.slurm keys its rank mapping on. (submitit only checks
    that an `srun` is on PATH when the executor is built; the stub on PATH is never run.)"""
    (tmp_path / "srun").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "srun").chmod(0o755)
    env.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    sweep = tmp_path / "sweep"
    with initialize_config_module("stack.conf", version_base=None):
        cfg = compose("config", overrides=["hydra/launcher=slurm", "hydra.launcher.nodes=4",
                                           "hydra.launcher.partition=gpu", f"hydra.sweep.dir={sweep}"],
                      return_hydra_config=True)
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    scripts = []

    def submit(executor, command: str) -> None:
        scripts.append(executor._make_submission_file_text(command, "uid"))
        raise Submitted

    env.setattr(submitit.SlurmExecutor, "_submit_command", submit)
    with pytest.raises(Submitted):
        launcher.launch([["optimizer.lr=1e-4"], ["optimizer.lr=3e-4"]], 0)
    lines = scripts[0].splitlines()
    for option in ("--array=0-1%2", "--nodes=4", "--ntasks-per-node=1", "--partition=gpu", "--time=1440",
                   "--signal=USR2@120", f"--output={sweep}/.submitit/%A_%a/%A_%a_0_log.out"):
        assert f"#SBATCH {option}" in lines, (option, scripts[0])
    assert "export SUBMITIT_EXECUTOR=slurm" in lines
    srun = next(line for line in lines if line.startswith("srun "))
    assert srun.endswith(f"-u -m submitit.core._submit {sweep}/.submitit/%j"), srun


def test_the_slurm_launcher_away_from_slurm_is_one_paragraph(env, tmp_path):
    """No `srun` on PATH: the README's SLURM command printed submitit's 30-line traceback."""
    argv = ["-m", "+recipe=llama_sft", "hydra/launcher=slurm", "hydra.launcher.nodes=4", "hydra.launcher.partition=gpu"]
    env.setenv("PATH", str(tmp_path))  # no srun
    with pytest.raises(ConfigError, match="no 'srun' on PATH: run the command on the cluster's login node") as info:
        preflight(argv)
    assert "\n" not in str(info.value) and "hydra/launcher=joblib" in str(info.value)
    (tmp_path / "srun").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "srun").chmod(0o755)
    assert preflight(argv).trainer.steps == 400  # on a login node
