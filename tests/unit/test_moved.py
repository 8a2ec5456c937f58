"""Stack 0.1's module paths (before stack/ became layered packages) fail with an error naming
the new path, in an import and in a `_target_`; every new path in the table imports."""

import importlib

import pytest
from omegaconf import OmegaConf

from stack.config.targets import check_targets
from stack.errors import MOVED, ConfigError, ModuleMoved, moved_to


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_names_its_new_one(old):
    new = MOVED[old]
    assert importlib.import_module(new).__name__ == new
    if new.startswith(old + "."):  # the old name is a package now (stack.run, stack.checkpoint, stack.hardware)
        return
    with pytest.raises(ModuleMoved, match=f"it moved to '{new}'"):
        importlib.import_module(old)


def test_a_submodule_of_a_moved_package_moved_with_it():
    assert moved_to("stack.trainer.signals") == "stack.engine.trainer.signals"
    assert moved_to("stack.schema.algorithm") == "stack.config.schema.algorithm"
    assert moved_to("stack.run.modes") is None and moved_to("stack.algorithms.dpo") is None
    with pytest.raises(ModuleMoved, match="'stack.trainer': it moved to 'stack.engine.trainer'"):  # the package first
        importlib.import_module("stack.trainer.signals")


def test_a_target_with_an_old_path_is_refused_naming_the_new_one():
    cfg = OmegaConf.create({"callback": {"_target_": "stack.report.SweepReport"}})
    with pytest.raises(ConfigError, match=r"'callback._target_'.*moved to 'stack.launch.report'"):
        check_targets(cfg)
    check_targets(OmegaConf.create({"callback": {"_target_": "stack.launch.report.SweepReport"}}))
