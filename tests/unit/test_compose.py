"""Composition of every group option and recipe; the schemas type every group."""

import os
import re

import pytest
from omegaconf import OmegaConf

from stack.config.quantization import check_config
from stack.config.schema import GROUPS, recipe_files
from stack.config.validate import validate
from stack.errors import ConfigError
from tests.helpers import REPO, make_cfg

OPTIONS = [
    (group, name[:-5])
    for group in GROUPS
    for name in sorted(os.listdir(os.path.join(REPO, "conf", group)))
    if name.endswith(".yaml")
]


def test_all_twelve_groups_have_options():
    assert set(GROUPS) == {"model", "mesh", "optimizer", "quantization", "data", "checkpoint",
                           "hardware", "algorithm", "reward", "env", "logger", "launcher"}
    for group in GROUPS:
        assert any(g == group for g, _ in OPTIONS), f"group {group} has no option"


# options with a key the user must set (the error names it)
REQUIRED = {("checkpoint", "persistent"): "checkpoint.path", ("checkpoint", "multi_tier"): "checkpoint.persistent.path",
            ("reward", "model"): "reward.init_from", ("model", "hf"): "model.path"}
# options that need a partner from another group (the error without it names the mismatch)
PARTNER = {("algorithm", "dpo"): "data=jsonl_prefs", ("data", "jsonl_prefs"): "algorithm=dpo",
           ("algorithm", "grpo"): "data=jsonl_prompts", ("data", "jsonl_prompts"): "algorithm=grpo",
           ("algorithm", "rm"): "data=jsonl_prefs", ("algorithm", "ppo"): "data=jsonl_prompts",
           ("mesh", "expert"): "model=qwen3_moe", ("env", "calculator"): "+recipe=llama_grpo"}
MISMATCH = {("mesh", "expert"): "model.num_experts=None",  # else a data kind's
            ("env", "calculator"): "rolls out multi-turn trajectories for algorithm=grpo"}


@pytest.mark.parametrize("group,option", OPTIONS)
def test_every_option_composes_typed_and_valid(group, option):
    required, partner = REQUIRED.get((group, option)), PARTNER.get((group, option))
    if required:
        with pytest.raises(ConfigError, match=f"'{required}' is required"):
            validate(make_cfg([f"{group}={option}"]))
    if partner:
        with pytest.raises(ConfigError, match=MISMATCH.get((group, option), "'data.kind'=.* does not fit algorithm=")):
            validate(make_cfg([f"{group}={option}"]))
    cfg = make_cfg([f"{group}={option}"] + ([f"{required}=/tmp/durable"] if required else [])
                   + ([partner] if partner else []))
    node = cfg[group]
    assert node[option] is True if group == "logger" else node.name == option  # logger: a list, each option a flag
    assert OmegaConf.get_type(node).__name__.endswith("Config"), "the option is not typed by its schema"
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    if group == "quantization" and node.method == "ptq":  # python -m stack.tools.quantize's options, not training's
        check_config(node)
        with pytest.raises(ConfigError, match="post-training quantization, not a way to train"):
            validate(cfg)
        return
    validate(cfg)


@pytest.mark.parametrize("recipe", sorted(recipe_files()))
def test_every_recipe_composes_to_the_options_it_names(recipe):
    """Each `override /group: option` of the recipe's defaults list is what the composed config holds."""
    cfg = make_cfg([f"+recipe={recipe}"])
    chosen = re.findall(r"override /(\w+): (\w+)", recipe_files()[recipe])
    assert chosen, "the recipe picks no group options"
    for group, option in chosen:
        assert cfg[group].name == option, (group, option)
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    validate(cfg)


def test_recipe_overrides_and_command_line_wins():
    cfg = make_cfg(["+recipe=llama_sft"])
    assert cfg.data.name == "jsonl_sft" and cfg.optimizer.lr == pytest.approx(3e-3)
    cfg = make_cfg(["+recipe=llama_sft", "optimizer.lr=1e-4", "trainer.steps=50"])
    assert cfg.optimizer.lr == pytest.approx(1e-4) and cfg.trainer.steps == 50


def test_shipped_data_paths_resolve_to_existing_files():
    cfg = make_cfg(["data=jsonl_sft"])
    assert os.path.isfile(cfg.data.path) and os.path.isfile(cfg.data.eval_path)


@pytest.mark.parametrize("choice", ["data=jsonl_sft", "data=jsonl_prefs", "data=jsonl_prompts", "+recipe=llama_rm"])
def test_your_own_data_path_is_never_evaluated_on_the_shipped_sample(choice):
    """data.path=yours alone left data.eval_path at the shipped eval file (eval/loss on unrelated
    records); now the eval split is a seeded data.eval_fraction of yours unless you give one."""
    shipped = make_cfg([choice]).data
    assert os.path.dirname(shipped.eval_path) == os.path.dirname(shipped.path)  # the sample and its eval file
    assert make_cfg([choice, "data.path=/data/mine.jsonl"]).data.eval_path is None
    mine = make_cfg([choice, "data.path=/data/mine.jsonl", "data.eval_path=/data/held_out.jsonl"]).data
    assert mine.eval_path == "/data/held_out.jsonl"


@pytest.mark.parametrize("hardware,sizes", [("cpu", (1, 1, 1)), ("tpu_v5e", (1, -1, 1)), ("gpu_h100", (1, 1, 1))])
def test_default_mesh_follows_the_hardware(hardware, sizes):
    cfg = make_cfg([f"hardware={hardware}"])
    assert cfg.mesh.name == "auto" and (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor) == sizes
    assert make_cfg([f"hardware={hardware}", "mesh=dp"]).mesh.data == -1  # an explicit choice wins


def test_tpu_chips_follow_the_topology():
    assert make_cfg(["hardware=tpu_v5e"]).hardware.chips == 4
    assert make_cfg(["hardware=tpu_v5e", "hardware.topology=v5e:4x4"]).hardware.chips == 16
    assert make_cfg(["hardware=tpu_v5p", "hardware.topology=v5p:2x2x2"]).hardware.chips == 8
