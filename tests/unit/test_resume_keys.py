"""Which config changes a resume accepts: loading knobs that keep the batches, not those that change them."""

import numpy as np

from stack.checkpoint import config_diff, math_config
from stack.data.pipeline import Batches
from stack.data.tokenizers import ByteTokenizer
from tests.conftest import make_cfg


def test_threads_prefetch_steps_and_remat_may_change_but_not_workers():
    saved = math_config(make_cfg(["data=jsonl_sft"]))
    free = make_cfg(["data=jsonl_sft", "data.read_threads=4", "data.prefetch=0", "trainer.steps=999",
                     "model.remat=full"])
    assert config_diff(saved, math_config(free)) == []
    assert config_diff(saved, math_config(make_cfg(["data=jsonl_sft", "data.workers=2"]))) == ["data.workers: 0 -> 2"]


def test_the_worker_count_changes_which_records_form_a_batch():
    """Why data.workers is fixed: Grain batches inside each worker's slice of the records."""
    def first_batches(*overrides):
        cfg = make_cfg(["data=jsonl_sft", *overrides]).data
        return [b["inputs"] for b in Batches(cfg, ByteTokenizer(), "train", seed=1, batch_size=8).take(2)]

    plain, threads = first_batches(), first_batches("data.read_threads=4", "data.prefetch=0")
    workers = first_batches("data.workers=2")
    assert all(np.array_equal(a, b) for a, b in zip(plain, threads))
    assert not all(np.array_equal(a, b) for a, b in zip(plain, workers))
