"""SFT: completion-only cross-entropy against a hand computation; formatting and masking."""

import json

import numpy as np
import pytest

from stack.algorithms.sft import SFT
from stack.data.encode import Encoder
from stack.data.tokenizers import ByteTokenizer, make_tokenizer
from stack.errors import ConfigError, DataError
from tests.helpers import FixedLogits, loss_of


def batch_and_logits(seed=0, b=3, t=7, v=11):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(b, t, v)).astype(np.float32)
    targets = rng.integers(0, v, size=(b, t)).astype(np.int32)
    mask = (rng.random((b, t)) > 0.4).astype(np.float32)
    return logits, {"inputs": targets, "targets": targets, "loss_mask": mask}


def test_loss_is_masked_mean_nll_by_hand():
    logits, batch = batch_and_logits()
    loss, metrics = loss_of(SFT(), FixedLogits(logits), batch)
    total, count = 0.0, 0
    for i in range(logits.shape[0]):
        for j in range(logits.shape[1]):
            if batch["loss_mask"][i, j]:
                row = logits[i, j].astype(np.float64)
                logz = np.log(np.sum(np.exp(row - row.max()))) + row.max()
                total += logz - row[batch["targets"][i, j]]
                count += 1
    assert float(loss) == pytest.approx(total / count, rel=1e-6)
    assert float(metrics["loss_tokens"]) == count
    summed, _ = loss_of(SFT(loss_reduction="sum"), FixedLogits(logits), batch)
    assert float(summed) == pytest.approx(total, rel=1e-6)


def test_masked_positions_cannot_leak():
    logits, batch = batch_and_logits(seed=1)
    loss, _ = loss_of(SFT(), FixedLogits(logits), batch)
    changed = dict(batch, targets=np.where(batch["loss_mask"] > 0, batch["targets"], 0))
    changed_logits = np.where(batch["loss_mask"][..., None] > 0, logits, 100.0)
    loss2, _ = loss_of(SFT(), FixedLogits(changed_logits), changed)
    assert float(loss2) == pytest.approx(float(loss), rel=1e-7)


def test_prompt_completion_masks_prompt():
    tok = ByteTokenizer()
    row = Encoder("sft", tok, "simple", 12, "keep_start")({"prompt": "1+2=", "completion": "3"})
    ids = [tok.bos_id] + tok.encode("1+2=") + tok.encode("3") + [tok.eos_id]
    assert row["inputs"][:5].tolist() == ids[:5] and row["targets"][:6].tolist() == ids[1:]
    # loss on the completion "3" and on EOS only (targets aligned)
    assert row["loss_mask"].tolist() == [0, 0, 0, 0, 1, 1] + [0] * 6
    assert row["targets"][row["loss_mask"] > 0].tolist() == [tok.encode("3")[0], tok.eos_id]
    assert row["inputs"][6] == tok.eos_id and (row["inputs"][7:] == tok.pad_id).all()


def test_chat_messages_loss_only_on_assistant():
    tok = ByteTokenizer()
    rec = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "yo"}, {"role": "user", "content": "again"},
                        {"role": "assistant", "content": "ok"}]}
    row = Encoder("sft", tok, "simple", 64, "keep_start")(rec)
    learned = tok.decode([t for t, m in zip(row["targets"], row["loss_mask"], strict=True) if m and t != tok.eos_id])
    assert learned == "yook"
    text = tok.decode(row["inputs"].tolist())
    assert text == "system: S\nuser: hi\nassistant: yo\nuser: again\nassistant: ok"
    assert row["targets"][row["loss_mask"] > 0][-1] == tok.eos_id


def test_truncation_policies():
    tok = ByteTokenizer()
    rec = {"prompt": "abc", "completion": "XYZUVW"}  # BOS + 9 + EOS = 11 tokens > 7
    start = Encoder("sft", tok, "simple", 6, "keep_start")(rec)
    end = Encoder("sft", tok, "simple", 6, "keep_end")(rec)
    assert start["inputs"][0] == tok.bos_id and tok.decode(start["inputs"].tolist()) == "abcXY"
    assert tok.decode(start["targets"].tolist()) == "abcXYZ" and tok.eos_id not in start["targets"]
    assert tok.decode(end["targets"].tolist()) == "XYZUVW"[1:] and end["targets"][-1] == tok.eos_id
    assert end["loss_mask"].tolist() == [1] * 6 and end["inputs"][0] == tok.encode("X")[0]
    with pytest.raises(DataError, match=r"f\.jsonl:3: 11 tokens > 7 \(data.seq_len=6\) with data.truncation=error"):
        Encoder("sft", tok, "simple", 6, "error")(dict(rec, _where="f.jsonl:3"))
    with pytest.raises(DataError, match="no token carries loss after truncation"):
        Encoder("sft", tok, "simple", 6, "keep_start")({"prompt": "abcdefgh", "completion": "XYZ"})


def test_bad_records_name_the_line():
    enc = Encoder("sft", ByteTokenizer(), "simple", 16, "keep_start")
    with pytest.raises(DataError, match=r"f\.jsonl:7.*string field 'completion' \(missing\)"):
        enc({"prompt": "x", "answer": "y", "_where": "f.jsonl:7"})
    with pytest.raises(DataError, match=r"f\.jsonl:8.*role"):
        enc({"messages": [{"role": "robot", "content": "x"}], "_where": "f.jsonl:8"})


def test_hf_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<s>": 0, "</s>": 1, "<pad>": 2, "1": 3, "+": 4, "2": 5, "=": 6, "3": 7, "[UNK]": 8}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.add_special_tokens(["<s>", "</s>", "<pad>"])
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    ours = make_tokenizer(str(tmp_path))
    assert (ours.bos_id, ours.eos_id, ours.pad_id, ours.vocab_size) == (0, 1, 2, 9)
    row = Encoder("sft", ours, "simple", 8, "keep_start")({"prompt": "1+2=", "completion": "3"})
    assert row["inputs"][:5].tolist() == [0, 3, 4, 5, 6] and row["targets"][4:6].tolist() == [7, 1]
    with pytest.raises(ConfigError, match="data.tokenizer"):
        make_tokenizer(str(tmp_path / "missing.json"))


def test_jsonl_malformed_line_names_file_and_line(tmp_path):
    from stack.data.sources import JsonlSource

    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n{oops\n")
    src = JsonlSource([str(path)])
    assert src[0]["prompt"] == "a"
    with pytest.raises(DataError, match=r"d\.jsonl:2: not valid JSON"):
        src[1]
