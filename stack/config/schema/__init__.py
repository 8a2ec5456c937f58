"""Dataclass schemas, registered in Hydra's ConfigStore by `register()`, which importing `stack.conf`
(Hydra's pkg://stack.conf, so every compose) calls; importing this package registers nothing.

Each group option file starts with `defaults: [/schema/<group>@_here_, _self_]` so the
option is typed by its schema (unknown keys and wrong types fail at compose time).
`logger` is a list group: the root schema types it once, its options only turn sinks on.
The root schema is `schema/root`, used by `conf/config.yaml`.
"""

import math
from importlib.resources import files
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from stack.config.schema.algorithm import AlgorithmConfig, DPOConfig, GRPOConfig, SFTConfig
from stack.config.schema.checkpoint import CheckpointConfig, TierConfig
from stack.config.schema.data import DataConfig
from stack.config.schema.env import EnvConfig
from stack.config.schema.hardware import HardwareConfig
from stack.config.schema.launcher import LauncherConfig
from stack.config.schema.logger import LoggerConfig
from stack.config.schema.mesh import MeshConfig
from stack.config.schema.model import ModelConfig, RopeScalingConfig
from stack.config.schema.optimizer import OptimizerConfig
from stack.config.schema.quantization import QuantizationConfig
from stack.config.schema.reward import RewardConfig
from stack.config.schema.rlhf import PPOConfig, RMConfig
from stack.config.schema.root import Config, TrainerConfig
from stack.config.schema.sweeper import OptunaSweeperConf

CONFIG_MODULE = "stack.conf"  # conf/ (and recipes/ as stack.conf.recipe), shipped as this package

GROUP_SCHEMAS = {
    "model": ModelConfig,
    "mesh": MeshConfig,
    "optimizer": OptimizerConfig,
    "quantization": QuantizationConfig,
    "data": DataConfig,
    "checkpoint": CheckpointConfig,
    "hardware": HardwareConfig,
    "algorithm": AlgorithmConfig,  # each option has its own subclass: schema/algorithm/<name>
    "reward": RewardConfig,
    "env": EnvConfig,
    "logger": LoggerConfig,
    "launcher": LauncherConfig,
}
GROUPS = tuple(GROUP_SCHEMAS)


def objective_of(cfg) -> str:
    """The run's objective metric: `sweep.objective`, `trainer.objective`, else the algorithm
    schema's default."""
    return cfg.sweep.objective or cfg.trainer.objective or OmegaConf.get_type(cfg.algorithm).objective


def shipped_data(name: str) -> str:
    """Absolute path of a sample data file shipped in `recipes/data/` (resolver `stack_data`)."""
    return str(files(f"{CONFIG_MODULE}.recipe").joinpath("data", name))


def paired_eval(path: Any, train: str, held_out: str) -> str | None:
    """The shipped eval file `held_out` while `data.path` is the shipped file `train` it was split
    from (resolver `stack_eval`); else None: your own data.path is evaluated on a seeded
    `data.eval_fraction` of itself (or set data.eval_path), never on the shipped sample."""
    return shipped_data(held_out) if path == shipped_data(train) else None


def mesh_axis_size(option: str, axis: str) -> int:
    """Axis size in mesh option `option` (resolver `stack_mesh`, used by mesh=auto)."""
    path = files(CONFIG_MODULE).joinpath("mesh", f"{option}.yaml")
    if not path.is_file():
        raise ValueError(f"hardware.default_mesh={option!r} is not a mesh option")
    return int(OmegaConf.create(path.read_text())[axis])


def topology_chips(topology: str) -> int:
    """Chips in a TPU topology such as "v5e:2x4" (resolver `stack_chips`)."""
    return math.prod(int(d) for d in topology.partition(":")[2].split("x"))


def recipe_files() -> dict[str, str]:
    """Recipe name -> YAML text of every `recipes/NAME.yaml` (shipped as stack.conf.recipe)."""
    root = files(f"{CONFIG_MODULE}.recipe")
    return {p.name[:-5]: p.read_text() for p in root.iterdir() if p.name.endswith(".yaml")}


def group_options() -> str:
    """`python -m stack --help`'s group list: each user-facing group with its options, then the
    recipes (Hydra's own list also showed the internal `schema` groups)."""
    root = files(CONFIG_MODULE)
    options = {g: sorted(p.name[:-5] for p in root.joinpath(g).iterdir() if p.name.endswith(".yaml")) for g in GROUPS}
    lines = [f"{group}: {', '.join(options[group])}" for group in sorted(GROUPS)]
    return "\n".join([*lines, f"recipe (+recipe=NAME): {', '.join(sorted(recipe_files()))}"])


def register() -> None:
    """Store every schema and the resolvers; make the recipes composable as `+recipe=NAME`.

    A wheel ships `recipes/` as the real folder `stack/conf/recipe/`, where Hydra finds it.
    An editable install maps the package `stack.conf.recipe` to `recipes/` without making it
    a subfolder of `conf/`, so there the recipes go into the ConfigStore instead (both at
    once would make Hydra treat the stored node as the file's schema).
    """
    OmegaConf.register_new_resolver("stack_data", shipped_data, replace=True)
    OmegaConf.register_new_resolver("stack_eval", paired_eval, replace=True)
    OmegaConf.register_new_resolver("stack_mesh", mesh_axis_size, replace=True)
    OmegaConf.register_new_resolver("stack_chips", topology_chips, replace=True)
    OmegaConf.register_new_resolver("stack_groups", group_options, replace=True)
    cs = ConfigStore.instance()
    if not files(CONFIG_MODULE).joinpath("recipe").is_dir():
        for name, text in recipe_files().items():
            cs.store(group="recipe", name=name, node=OmegaConf.create(text), package="_global_")
    cs.store(group="schema", name="root", node=Config)
    cs.store(group="hydra/sweeper", name="optuna", node=OptunaSweeperConf, provider="stack")
    for group, node in GROUP_SCHEMAS.items():
        if group != "algorithm":
            cs.store(group="schema", name=group, node=node)
    cs.store(group="schema/algorithm", name="sft", node=SFTConfig)
    cs.store(group="schema/algorithm", name="dpo", node=DPOConfig)
    cs.store(group="schema/algorithm", name="grpo", node=GRPOConfig)
    cs.store(group="schema/algorithm", name="rm", node=RMConfig)
    cs.store(group="schema/algorithm", name="ppo", node=PPOConfig)


__all__ = [
    "AlgorithmConfig", "CheckpointConfig", "Config", "DataConfig", "GROUPS", "GROUP_SCHEMAS",
    "HardwareConfig", "LauncherConfig", "LoggerConfig", "MeshConfig", "ModelConfig", "OptimizerConfig",
    "QuantizationConfig", "RewardConfig", "RopeScalingConfig", "SFTConfig", "DPOConfig", "GRPOConfig",
    "PPOConfig", "RMConfig", "TierConfig", "TrainerConfig", "register", "CONFIG_MODULE",
    "group_options", "mesh_axis_size", "paired_eval", "recipe_files", "shipped_data", "topology_chips",
]
