"""The config of a recipe's warm-start stage (`warm_start.recipe`, e.g. SFT before GRPO): its recipe
and overrides, composed with the main run's model, mesh, hardware and seed (stack.run.warm_start
trains it), and its key: the digest of that resolved config and stack's version, which names the
one dir every run asking for the same stage shares. Composed before the run too, so its targets
are checked before anything exists."""

import glob
import hashlib
import importlib.metadata
import os

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict

from stack.config.schema import CONFIG_MODULE
from stack.errors import ConfigError


def stage_config(cfg: DictConfig) -> DictConfig:
    """The warm-start stage's config (no run dir yet): its recipe, the main run's model/mesh/hardware/seed."""
    overrides = [f"+recipe={cfg.warm_start.recipe}", *cfg.warm_start.overrides, "checkpoint=local", "logger=jsonl"]
    try:
        if GlobalHydra.instance().is_initialized():
            stage = compose(config_name="config", overrides=overrides)
        else:
            with initialize_config_module(CONFIG_MODULE, version_base=None):
                stage = compose(config_name="config", overrides=overrides)
    except Exception as exc:
        raise ConfigError(f"'warm_start'={OmegaConf.to_container(cfg.warm_start)} cannot be composed: "
                          f"{str(exc).splitlines()[0]}") from exc
    with open_dict(stage):
        for key in ("mesh", "hardware", "seed"):
            stage[key] = cfg[key]
        stage.model = OmegaConf.merge(cfg.model, {"init_from": None})
    return stage


def data_files(stage: DictConfig) -> str:
    """Each data file of `stage` (data.path, data.eval_path: a path, a glob or a list) with its size and
    modification time: a file edited in place (same path) names another stage."""
    specs = [stage.data.get(key) for key in ("path", "eval_path")]
    patterns = [str(p) for spec in specs if spec for p in ([spec] if isinstance(spec, str) else spec)]
    files = sorted({f for pattern in patterns for f in glob.glob(os.path.expanduser(pattern))})
    return "\n".join(f"{f} {os.stat(f).st_size} {os.stat(f).st_mtime_ns}" for f in files if os.path.isfile(f))


def stage_key(stage: DictConfig) -> str:
    """16 hex digits naming `stage`: its resolved config without a run dir, its data files (data_files)
    and stack's version."""
    try:
        version = importlib.metadata.version("stack")
    except importlib.metadata.PackageNotFoundError:  # a bare checkout, not installed
        version = "source"
    text = OmegaConf.to_yaml(OmegaConf.merge(stage, {"run_dir": None}), resolve=True)
    return hashlib.sha256(f"{version}\n{text}\n{data_files(stage)}".encode()).hexdigest()[:16]


def has_stage(cfg: DictConfig) -> bool:
    """Whether `cfg` trains a warm-start stage first (a recipe named and no `model.init_from`)."""
    return bool(cfg.warm_start.recipe) and not cfg.model.init_from
