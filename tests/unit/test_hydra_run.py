"""A plain run is composed once (stack.launch.hydra_job): the preflight's composition is the config Hydra
runs, and its job runs as `@hydra.main`'s would (its run dir, HydraConfig, mode RUN)."""

import os

from hydra import compose, initialize_config_module
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict

from stack.cli import app
from stack.launch import hydra_job


def test_a_plain_run_is_composed_once_and_runs_as_hydras_job(tmp_path, monkeypatch):
    loads, load = [], ConfigLoaderImpl.load_configuration
    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration",
                        lambda self, *a, **kw: loads.append(kw["overrides"]) or load(self, *a, **kw))
    task_overrides = ["+recipe=llama_sft", "trainer.steps=3"]
    seen = {}

    def task(cfg):
        hc = HydraConfig.get()
        seen.update(steps=cfg.trainer.steps, hydra_node="hydra" in cfg, dir=hc.runtime.output_dir, mode=hc.mode,
                    task=list(hc.overrides.task), job=hc.job.name)
        return 7

    with initialize_config_module(app.CONFIG_MODULE, version_base=None):
        job, whole = app.composed([*task_overrides, f"hydra.run.dir={tmp_path}/run"])
        assert hydra_job.run(whole, task) == 7
        reference = compose("config", overrides=task_overrides)  # the compose API: the job part alone
    assert len(loads) == 2  # the run's one composition, then the reference's
    assert seen == {"steps": 3, "hydra_node": False, "dir": f"{tmp_path}/run", "mode": RunMode.RUN,
                    "task": task_overrides, "job": "app"}
    assert "hydra" not in job and OmegaConf.to_container(job) == OmegaConf.to_container(reference)
    assert (tmp_path / "run").is_dir()


def test_sweeps_and_shown_configs_are_left_to_hydra():
    with initialize_config_module(app.CONFIG_MODULE, version_base=None):
        for argv in (["-m", "seed=0,1"], ["seed=1", "--cfg", "job"], ["seed=1", "hydra.mode=MULTIRUN"]):
            job, whole = app.composed(argv)
            assert job.seed in (0, 1) and whole is None, argv
        assert app.composed(["seed=1"])[1].hydra.mode == RunMode.RUN


def test_run_dir_is_hydras_job_dir_in_every_mode_with_no_log_file(tmp_path):
    """`run_dir=PATH`, whatever the mode and Hydra's logging: Hydra's job dir is PATH, with no
    `.hydra/` and no file handler (app.log); a user's own hydra.run.dir is left as given."""
    with initialize_config_module(app.CONFIG_MODULE, version_base=None):
        for extra in (["mode=train"], ["mode=compile"], ["mode=validate"], ["hydra/job_logging=disabled"]):
            overrides = [*extra, f"run_dir={tmp_path}/run"]
            job, whole = app.composed(overrides)
            hydra_job.into_run_dir(whole, job, overrides)
            logging = whole.hydra.job_logging
            assert (whole.hydra.run.dir, whole.hydra.output_subdir) == (f"{tmp_path}/run", None), extra
            assert ("file" not in logging.get("handlers", {})
                    and "file" not in logging.get("root", {}).get("handlers", []))
        overrides = ["mode=compile", f"run_dir={tmp_path}/run", f"hydra.run.dir={tmp_path}/mine"]
        job, whole = app.composed(overrides)
        hydra_job.into_run_dir(whole, job, overrides)
        assert whole.hydra.run.dir == f"{tmp_path}/mine" and "file" in whole.hydra.job_logging.handlers


def test_two_runs_in_the_same_second_get_a_default_dir_each(tmp_path, monkeypatch):
    """Hydra's default outputs/DATE/H-M-S is claimed with os.mkdir; the next run that second gets `-1`
    (both wrote into one dir, and the second was refused as its owner's, issue 81)."""
    monkeypatch.chdir(tmp_path)
    dirs = []
    with initialize_config_module(app.CONFIG_MODULE, version_base=None):
        for _ in range(2):
            job, whole = app.composed(["trainer.steps=3"])
            with open_dict(whole.hydra):
                whole.hydra.run.dir = "outputs/day/10-00-00"  # as `${now:...}` resolves it, in one second
            hydra_job.into_run_dir(whole, job, ["trainer.steps=3"])
            dirs.append(whole.hydra.run.dir)
    assert dirs == ["outputs/day/10-00-00", "outputs/day/10-00-00-1"]
    assert sorted(os.listdir(tmp_path / "outputs" / "day")) == ["10-00-00", "10-00-00-1"]
