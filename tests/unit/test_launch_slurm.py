"""The SLURM rank mapping: submitit's job environment -> the STACK_* variables of
jax.distributed.initialize (coordinator on the first node, one process per task)."""

import os

import pytest

from stack.launch_slurm import export_ranks, submitit_ranks

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
