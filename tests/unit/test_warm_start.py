"""Shared warm starts (issue 81 item 4): one dir per stage config, reused by every run that asks for
the same stage (GRPO's and PPO's), trained once, waited for while another run trains it."""

import os
from types import SimpleNamespace

from stack.checkpoint.job_status import write_status
from stack.config.warm_start import stage_config, stage_key
from stack.errors import RunDirInUse
from stack.run import warm_start as ws
from tests.helpers import make_cfg


def key(*overrides: str) -> str:
    return stage_key(stage_config(make_cfg(list(overrides))))


def test_grpo_and_ppo_share_their_warm_start_and_a_changed_stage_does_not():
    assert key("+recipe=llama_grpo") == key("+recipe=llama_ppo") == key("+recipe=llama_grpo", "optimizer.lr=1e-6")
    assert key("+recipe=llama_grpo") != key("+recipe=llama_grpo", "seed=1")  # the stage uses the run's seed
    assert key("+recipe=llama_grpo") != key("+recipe=llama_grpo", "warm_start.overrides=['trainer.steps=801']")
    assert key("+recipe=llama_grpo") != key("+recipe=llama_rm")  # another stage recipe's overrides


def test_a_data_file_edited_in_place_names_another_stage(tmp_path):
    """The same path with other contents (before, a stale warm start was reused)."""
    data = tmp_path / "sft.jsonl"
    data.write_text('{"prompt": "1+1=", "completion": "2"}\n')
    overrides = ["+recipe=llama_grpo", f"warm_start.overrides=['data.path={data}','data.eval_path={data}']"]
    before = key(*overrides)
    assert key(*overrides) == before  # unchanged: reused
    data.write_text('{"prompt": "1+1=", "completion": "3"}\n{"prompt": "2+2=", "completion": "4"}\n')
    assert key(*overrides) != before


def test_a_stage_is_trained_once_then_reused_by_another_run(tmp_path, capsys):
    cfg = make_cfg(["+recipe=llama_grpo", f"warm_start.dir={tmp_path}/warm"])
    trained = []

    def train_run(stage):
        trained.append(stage.run_dir)
        return SimpleNamespace(status="completed", message="", final_step=800)

    first = ws.warm_start(cfg, str(tmp_path / "a"), train_run)
    second = ws.warm_start(cfg, str(tmp_path / "b"), train_run)
    where = f"{tmp_path}/warm/{key('+recipe=llama_grpo')}"
    assert trained == [where] and first.model.init_from == second.model.init_from == f"{where}/checkpoints"
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"warm start: +recipe=llama_sft in {where} (model.init_from is not set)"
    assert out[1].startswith("warm start: done in ") and out[1].endswith(f"({where}); the run starts from it")
    assert out[2] == f"warm start: reusing +recipe=llama_sft from {where} (trained earlier)"


def test_a_run_waits_while_another_trains_the_stage_and_an_old_run_dir_keeps_its_own(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ws, "WAIT_SECONDS", 0.01)
    cfg = make_cfg(["+recipe=llama_grpo", f"warm_start.dir={tmp_path}/warm"])
    tries = []

    def busy(stage):  # another process holds the stage's dir for two looks, then has finished it
        tries.append(1)
        if len(tries) == 2:
            write_status(stage.run_dir, "completed")
        raise RunDirInUse("in use")

    ws.warm_start(cfg, str(tmp_path / "a"), busy)
    assert len(tries) == 2 and "another run is training it in" in capsys.readouterr().out
    os.makedirs(tmp_path / "old" / "warm_start")  # a run dir from before warm starts were shared
    assert ws.stage_dir(cfg, stage_config(cfg), str(tmp_path / "old")) == str(tmp_path / "old" / "warm_start")
