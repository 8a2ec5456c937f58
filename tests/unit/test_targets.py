"""The instantiation allow-list judges the object a `_target_` names, not its text (issue 15,
item 1): hostile targets are refused with the key path by `build` (before it builds anything;
`validate` refuses those outside the allowed packages without importing), and none ran."""

import os

import pytest
from omegaconf import OmegaConf

from stack.config.pre_run import check_before_run
from stack.config.validate import validate
from stack.errors import ConfigError
from stack.run.build import build
from tests.helpers import make_cfg

CHAIN = "optimizer.chain"


def hostile(marker: str, victim: str) -> list[tuple[str, object, list[str]]]:
    """(key, node, extra overrides): each would touch `marker` or delete `victim` if it ran."""
    touch = f"touch {marker}"
    entry = lambda node: (f"{CHAIN}.0", node, [])  # noqa: E731
    return [
        # stdlib via a module
        entry({"_target_": "stack.checkpoint.manager.shutil.copyfile", "_args_": [__file__, marker]}),
        entry({"_target_": "stack.cli.app.os.system", "_args_": [touch]}),
        entry({"_target_": "builtins.exec", "_args_": [f"open({marker!r}, 'w')"]}),
        entry({"_target_": "os.system", "_args_": [touch]}),
        entry({"_target_": "subprocess.run", "_args_": [["touch", marker]]}),
        entry({"_target_": "shutil.rmtree", "_args_": [victim]}),
        entry({"_target_": "pickle.loads", "_args_": [b"x"]}),
        entry({"_target_": "stack.cli.app.__builtins__", "_args_": []}),  # getattr trick
        entry({"_target_": "stack.config.schema.OmegaConf.create", "_args_": []}),  # a class method from elsewhere
        entry({"_target_": "stack.rewards.runner.multiprocessing.Process", "target": "os.system"}),
        entry({"_target_": "optax.clip_by_global_norm",  # nested inside an allowed one's _args_
               "_args_": [{"_target_": "stack.checkpoint.manager.shutil.rmtree", "_args_": [victim]}]}),
        entry({"_target_": "optax.chain", "_args_": [[{"_target_": "os.system", "_args_": [touch]}]]}),  # in a list
        entry({"_target_": "${oc.env:STACK_TEST_TARGET}", "_args_": [touch]}),  # an interpolation
        (f"{CHAIN}.1", "${oc.create:{_target_: os.system, _args_: ['" + touch + "']}}", []),  # hidden in a resolver
        (f"{CHAIN}.0", {"_target_": "stack.cli.app.os.system", "_args_": [touch]}, ["allow_targets=[stack]"]),
        ("algorithm._target_", "stack.run.build.instantiate", []),
    ]


def test_the_pre_run_check_refuses_every_hostile_target_and_reward_function(tmp_path, monkeypatch):
    """`check_before_run` (python -m stack runs it before a run dir or its lock exists) judges the
    objects too: what `validate` lets through by its text is refused here, not in `build`."""
    marker, victim = str(tmp_path / "ran"), tmp_path / "keep"
    victim.mkdir()
    monkeypatch.setenv("STACK_TEST_TARGET", "os.system")
    for key, node, extra in hostile(marker, str(victim)):
        cfg = make_cfg(extra)
        OmegaConf.set_struct(cfg, False)
        OmegaConf.update(cfg, key, node, merge=False)
        with pytest.raises(ConfigError, match="cannot be built"):
            check_before_run(cfg)
    cfg = make_cfg(["+recipe=llama_grpo", "reward.functions=[accuracy,stack.cli.app.os.system]",
                    "allow_targets=[stack]"])
    validate(cfg)  # its text is under an allowed package
    with pytest.raises(ConfigError, match="'stack.cli.app.os.system' cannot be used: it names a builtin"):
        check_before_run(cfg)
    assert not os.path.exists(marker) and victim.is_dir()


def test_hostile_targets_are_refused_with_their_key_and_none_runs(tmp_path, monkeypatch):
    marker, victim = str(tmp_path / "ran"), tmp_path / "keep"
    victim.mkdir()
    monkeypatch.setenv("STACK_TEST_TARGET", "os.system")
    cases = hostile(marker, str(victim))
    assert len(cases) >= 12
    for key, node, extra in cases:
        cfg = make_cfg(extra)
        OmegaConf.set_struct(cfg, False)
        OmegaConf.update(cfg, key, node, merge=False)
        with pytest.raises(ConfigError, match="cannot be built") as err:
            validate(cfg)
            build(cfg, str(tmp_path / "run"))
        assert f"'{key.rsplit('._target_', 1)[0]}" in str(err.value), (key, node, str(err.value))
        assert not os.path.exists(marker) and victim.is_dir(), (key, node)


def test_allowed_targets_pass_and_user_packages_need_opting_in():
    from stack.config.targets import check_targets

    check_targets(make_cfg(["+recipe=llama_dpo"]))  # stack.*, optax.* targets of a real recipe
    cfg = make_cfg(["allow_targets=[tests]"])
    OmegaConf.update(cfg, "algorithm._target_", "tests.unit.toy_reinforce.Reinforce")
    check_targets(cfg, ("tests",))
    from stack.rewards.group import resolve

    with pytest.raises(ConfigError, match="reward.functions.*shutil.copyfile, defined outside the allowed packages"):
        resolve("stack.checkpoint.manager.shutil.copyfile", ("stack",))
