"""Precomputed per-record columns (DPO's precompute_reference): they follow their record
through shuffles and epochs, and a run that reads them matches one that computes in-step."""

import json

import numpy as np
import pytest

from stack.data.pipeline import Batches
from stack.data.tokenizers import ByteTokenizer
from stack.engine.precompute import attach_columns
from stack.engine.trainer import train
from stack.errors import ConfigError
from stack.run.build import build
from tests.helpers import captured, make_cfg

TOK = ByteTokenizer()
N = 37  # not a multiple of the batch size: the first pass pads its last batch


def prefs_file(tmp_path) -> str:
    path = tmp_path / "prefs.jsonl"
    rows = [{"prompt": f"item {i}:", "chosen": "yes", "rejected": "no"} for i in range(N)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def record_id(row_inputs: np.ndarray) -> int:
    """The i of 'item i:' in a row's chosen inputs (decoded independently of the pipeline)."""
    text = TOK.decode([t for t in row_inputs[0].tolist() if t >= 3])
    return int(text.split("item ")[1].split(":")[0])


def test_columns_follow_their_record_through_shuffled_epochs(tmp_path):
    cfg = make_cfg(["data=jsonl_prefs", f"data.path={prefs_file(tmp_path)}", f"data.eval_path={tmp_path}/prefs.jsonl",
                    "data.seq_len=24"]).data
    batches = Batches(cfg, TOK, "train", seed=3, batch_size=8)
    tags = np.arange(N, dtype=np.float32) * 10 + 0.5  # any per-record value
    it = iter(batches.with_columns({"tag": tags}))
    seen = []
    for _ in range(12):  # 96 rows: more than 2 epochs of 37 records
        batch = next(it)
        assert batch["tag"].shape == (8,)
        for inputs, tag in zip(batch["inputs"], batch["tag"], strict=True):
            seen.append(record_id(inputs))
            assert tag == tags[seen[-1]]
    it.close()
    assert sorted(seen[:N]) == list(range(N)) and seen[:N] != sorted(seen[:N])  # shuffled, every record

    indices, padded = zip(*batches.ordered(), strict=True)
    assert np.concatenate(indices).tolist() == list(range(N))  # every record once, in order
    assert [b["inputs"].shape[0] for b in padded] == [8] * 5
    assert [record_id(x) for x in padded[-1]["inputs"][:5]] == [32, 33, 34, 35, 36]


RUN = ["+recipe=llama_dpo", "trainer.steps=6", "trainer.log_every=1", "trainer.eval_every=3", "trainer.eval_batches=2",
       "checkpoint=none", "logger=jsonl", "data.batch_size=8"]


def run(tmp_path, overrides):
    tmp_path.mkdir()
    exp, cap = captured(build(make_cfg(RUN + overrides + [f"run_dir={tmp_path}"]), str(tmp_path)))
    train(exp)
    return {(r["step"], k): v for r in cap.rows for k, v in r.items() if k.startswith(("train/", "eval/"))
            and not k.startswith("train/lr")}


@pytest.mark.parametrize("extra", [[], ["quantization=lora", "optimizer.lr=1e-2"]], ids=["copy", "lora"])
def test_precomputed_reference_gives_the_in_step_losses(tmp_path, extra, capsys):
    in_step = run(tmp_path / "a", extra)
    pre = run(tmp_path / "b", extra + ["algorithm.precompute_reference=true"])
    assert "precomputed ref_logps" in capsys.readouterr().out
    assert set(pre) == set(in_step)
    assert in_step[(6, "train/rewards/margins")] != 0.0  # the policy moved away from the reference
    for key, value in in_step.items():
        assert pre[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_a_resume_with_more_eval_batches_than_were_precomputed_is_refused(tmp_path):
    exp = build(make_cfg(RUN + [f"run_dir={tmp_path}", "logger=console"]), str(tmp_path))  # 2 eval batches
    n = exp.train_batches.batch_size
    one = {"train": {"ref_logps": np.zeros((exp.train_batches.records, 2), np.float32)},
           "eval": {"ref_logps": np.zeros((1, n, 2), np.float32)}}
    with pytest.raises(ConfigError, match=r"trainer.eval_batches'=2 .* cover 1 eval batches"):
        attach_columns(exp, one)
    two = {**one, "eval": {"ref_logps": np.zeros((2, n, 2), np.float32)}}
    _, evals = attach_columns(exp, two)
    assert [e["ref_logps"].shape for e in evals] == [(n, 2), (n, 2)]
