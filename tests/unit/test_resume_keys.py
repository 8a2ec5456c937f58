"""Which config changes a resume accepts: loading knobs that keep the batches, not those that change them."""

import numpy as np
import pytest

from stack.checkpoint.manager import Checkpointer, config_diff, math_config
from stack.data.pipeline import Batches
from stack.data.tokenizers import ByteTokenizer
from stack.errors import ConfigError
from tests.helpers import make_cfg


def test_threads_prefetch_steps_and_remat_may_change_but_not_workers():
    saved = math_config(make_cfg(["data=jsonl_sft"]))
    free = make_cfg(["data=jsonl_sft", "data.read_threads=4", "data.prefetch=0", "trainer.steps=999",
                     "model.remat=full", "model.init_from=/shared/warm_starts/0123/checkpoints"])  # step 0 only
    assert config_diff(saved, math_config(free)) == []
    assert config_diff(saved, math_config(make_cfg(["data=jsonl_sft", "data.workers=2"]))) == ["data.workers: 0 -> 2"]


def test_a_checkpoint_from_before_an_option_existed_resumes_while_the_option_is_off():
    """Its saved config lacks the key: null or false now (the option off, the old math) is no
    change; set, or a new key whose default is on, is. Before, every key added to stack refused
    the resume of older checkpoints (`data.train_on_input: None -> False`)."""
    saved = math_config(make_cfg(["data=jsonl_sft"]))
    del saved["data"]["train_on_input"], saved["algorithm"]["loss_reduction"]
    saved["quantization_v0"] = {"rank": None}  # a group dropped since, off
    assert config_diff(saved, math_config(make_cfg(["data=jsonl_sft"]))) == [
        "algorithm.loss_reduction: '<absent>' -> 'mean'"]
    on = math_config(make_cfg(["data=jsonl_sft", "data.train_on_input=true"]))
    assert "data.train_on_input: '<absent>' -> True" in config_diff(saved, on)
    assert config_diff({"a": 1}, {"a": 1, "new": {"x": None, "y": False}}) == []
    assert config_diff({"a": 1}, {"a": 1, "new": {"x": 0.5}}) == ["new.x: '<absent>' -> 0.5"]
    assert config_diff({"a": 1}, {"a": 1, "env": {"name": "none", "environment": None}}) == []  # a group's off
    assert config_diff({"a": 1}, {"a": 1, "env": {"name": "calculator"}}) == ["env.name: '<absent>' -> 'calculator'"]
    assert config_diff({"a": 1, "gone": 3}, {"a": 1}) == ["gone: 3 -> '<absent>'"]


def test_the_worker_count_changes_which_records_form_a_batch():
    """Why data.workers is fixed: Grain batches inside each worker's slice of the records."""
    def first_batches(*overrides):
        cfg = make_cfg(["data=jsonl_sft", *overrides]).data
        return [b["inputs"] for b in Batches(cfg, ByteTokenizer(), "train", seed=1, batch_size=8).take(2)]

    plain, threads = first_batches(), first_batches("data.read_threads=4", "data.prefetch=0")
    workers = first_batches("data.workers=2")
    assert all(np.array_equal(a, b) for a, b in zip(plain, threads, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(plain, workers, strict=True))


def test_a_refused_resume_offers_the_checkpoint_as_init_from_when_the_model_is_the_same(tmp_path):
    """A new learning rate cannot resume the run, but a new run can start from its weights; a new
    model shape cannot, so the advice is left out."""
    saved = {"config": math_config(make_cfg(["checkpoint=none"]))}
    where = str(tmp_path / "checkpoints" / "20")
    advice = r"optimizer\.lr: .* new run dir, with model\.init_from=\S+/checkpoints to start"
    with pytest.raises(ConfigError, match=advice):
        Checkpointer(make_cfg(["checkpoint=none", "optimizer.lr=1e-5"]), str(tmp_path))._check_config(saved, where)
    with pytest.raises(ConfigError, match=r"model\.d_ff: 176 -> 96\. .* new run dir\. A resume") as refused:
        Checkpointer(make_cfg(["checkpoint=none", "model.d_ff=96"]), str(tmp_path))._check_config(saved, where)
    assert "init_from" not in str(refused.value)
