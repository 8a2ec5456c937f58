"""Grain pipelines end to end: formats, packing, per-epoch shuffles, sharding, exact resume."""

import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stack.data.pipeline import Batches
from stack.data.tokenizers import ByteTokenizer
from stack.errors import ConfigError, DataError
from tests.helpers import loss_of, make_cfg

TOK = ByteTokenizer()


def problems(n: int, start: int = 0) -> list[dict]:
    return [{"prompt": f"{i}+{i}=", "completion": str(2 * i)} for i in range(start, start + n)]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def data_cfg(path, *overrides: str):
    """The `data` node of `data=jsonl_sft` over `path` (a held-out file alongside)."""
    return make_cfg(["data=jsonl_sft", f"data.path={path}", f"data.eval_path={path}", "data.seq_len=16",
                     *overrides]).data


def completions(batch) -> list[str]:
    """The completion text of each (unpacked) row, for comparing record orders."""
    return [TOK.decode(t[m > 0].tolist()) for t, m in zip(batch["targets"], batch["loss_mask"], strict=True)]


def read(batches: Batches, n: int, state=None) -> list[list[str]]:
    it = iter(batches)
    if state is not None:
        it.set_state(state)
    out = [completions(next(it)) for _ in range(n)]
    it.close()
    return out


def test_each_epoch_is_a_new_permutation_and_epochs_are_counted(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", problems(20))
    b = Batches(data_cfg(path), TOK, "train", seed=3, batch_size=4)
    it = iter(b)
    epochs = [sum((completions(next(it)) for _ in range(5)), []) for _ in range(3)]
    assert b.epoch(it.get_state()) == 3.0
    it.close()
    assert all(sorted(ep) == sorted(str(2 * i) for i in range(20)) for ep in epochs)
    assert epochs[0] != epochs[1] != epochs[2]
    assert read(Batches(data_cfg(path), TOK, "train", seed=3, batch_size=4), 5) == [
        epochs[0][i:i + 4] for i in range(0, 20, 4)]


@pytest.mark.parametrize("extra", [[], ["data.packing=true"], ["data.prefetch=0", "data.read_threads=2"],
                                   ["data.workers=2"]], ids=["plain", "packed", "threads", "workers"])
def test_restored_iterator_continues_the_exact_sequence_across_epochs(tmp_path, extra):
    path = write_jsonl(tmp_path / "d.jsonl", problems(22))
    cfg = data_cfg(path, *extra)
    it = iter(Batches(cfg, TOK, "train", seed=1, batch_size=4))
    for _ in range(3):
        next(it)
    state = it.get_state()
    uninterrupted = [next(it) for _ in range(9)]  # crosses two epoch boundaries (22 records / 4)
    it.close()
    resumed = iter(Batches(cfg, TOK, "train", seed=1, batch_size=4))
    resumed.set_state(json.loads(json.dumps(state)))  # the state survives a JSON round trip
    for a in uninterrupted:
        b = next(resumed)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    resumed.close()


def test_eval_batches_are_the_same_whatever_the_worker_count(tmp_path):
    """Worker processes are for the train split: with data.workers=2 each of 2 workers batched
    every other record, so eval/loss moved with a throughput setting (5.9592 -> 5.9897)."""
    path = write_jsonl(tmp_path / "d.jsonl", problems(24))
    batches = [Batches(data_cfg(path, *extra), TOK, "eval", 0, 4).take(2) for extra in ([], ["data.workers=2"])]
    assert [completions(b) for b in batches[0]] == [completions(b) for b in batches[1]]


def test_shards_are_disjoint_and_cover_an_epoch(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", problems(24))
    cfg = data_cfg(path)
    shards = [sum(read(Batches(cfg, TOK, "train", 5, 3, shard_index=i, shard_count=2), 4), []) for i in range(2)]
    assert not set(shards[0]) & set(shards[1])
    assert len(set(shards[0]) | set(shards[1])) == 24


def test_packing_keeps_every_example_and_isolates_segments(tmp_path):
    rows = problems(40)
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    packed = next(iter(Batches(data_cfg(path, "data.packing=true", "data.shuffle=false", "data.seq_len=32"),
                               TOK, "train", 0, 4)))
    plain = next(iter(Batches(data_cfg(path, "data.shuffle=false", "data.seq_len=32"), TOK, "train", 0, 4)))
    seen = []
    for r in range(4):
        seg, pos = packed["segment_ids"][r], packed["positions"][r]
        for s in range(1, seg.max() + 1):
            where = seg == s
            assert pos[where].tolist() == list(range(where.sum()))  # positions restart per segment
            inputs = packed["inputs"][r][where]
            assert inputs[0] == TOK.bos_id and packed["targets"][r][where][-1] == TOK.eos_id
            seen.append(TOK.decode(inputs.tolist()))
        assert (packed["loss_mask"][r][seg == 0] == 0).all() and (packed["inputs"][r][seg == 0] == TOK.pad_id).all()
    texts = {p["prompt"] + p["completion"] for p in rows}
    assert len(seen) >= 12 and all(t in texts for t in seen)
    assert (packed["segment_ids"] > 0).mean() > 2 * (plain["segment_ids"] > 0).mean()


@pytest.mark.parametrize("packing", [False, True])
def test_train_on_input_puts_loss_on_every_real_target(tmp_path, packing):
    """data.train_on_input=true (TRL SFTTrainer's default on conversations): every target of every
    example carries loss, padding none; off (the default), the completions' only."""
    path = write_jsonl(tmp_path / "d.jsonl", problems(20))
    every, only = (next(iter(Batches(data_cfg(path, f"data.packing={packing}", "data.shuffle=false",
                                              f"data.train_on_input={flag}"), TOK, "train", 0, 4)))
                   for flag in ("true", "false"))
    assert (every["loss_mask"] == (every["segment_ids"] > 0)).all()
    assert 0 < only["loss_mask"].sum() < (only["segment_ids"] > 0).sum() / 2


def test_packed_loss_equals_unpacked_loss(tmp_path):
    """The model does not attend across segments: packed rows give each example's own loss."""
    import jax
    from flax import nnx

    from stack.algorithms.sft import SFT
    from stack.models.init import init_model

    path = write_jsonl(tmp_path / "d.jsonl", problems(12, start=95))
    cfg = make_cfg(["data=jsonl_sft", f"data.path={path}", "data.seq_len=24", "data.shuffle=false"])
    model = init_model(cfg.model, 0)
    packed = next(iter(Batches(dict_cfg(cfg.data, packing=True), TOK, "train", 0, 2)))
    n = int(packed["segment_ids"].max(axis=1).sum())  # the examples in the packed rows
    plain = next(iter(Batches(dict_cfg(cfg.data, packing=False), TOK, "train", 0, n)))
    sft = SFT(loss_reduction="sum")
    loss = nnx.jit(lambda m, b: loss_of(sft, m, b)[0])  # one compiled program per layout
    got, want = float(loss(model, jax.tree.map(np.asarray, packed))), float(loss(model, plain))
    assert got == pytest.approx(want, rel=1e-5)


def dict_cfg(data, **changes):
    from omegaconf import OmegaConf

    out = OmegaConf.create(OmegaConf.to_container(data, resolve=True))
    for k, v in changes.items():
        out[k] = v
    return out


def test_parquet_glob_and_seeded_fraction_split(tmp_path):
    rows = problems(30)
    for i in range(3):
        pq.write_table(pa.Table.from_pylist(rows[i * 10:(i + 1) * 10]), tmp_path / f"shard-{i}.parquet")
    cfg = make_cfg(["data=parquet_sft", f"data.path={tmp_path}/shard-*.parquet", "data.eval_fraction=0.2",
                    "data.seq_len=16", "data.shuffle=false"]).data
    train = sum(read(Batches(cfg, TOK, "train", 7, 4), 6), [])
    evals = sum((completions(b) for b in Batches(cfg, TOK, "eval", 7, 2).take(10)), [])
    assert len(evals) == 6 and len(set(train)) == 24 and not set(train) & set(evals)


def test_missing_file_and_empty_file(tmp_path):
    with pytest.raises(ConfigError, match=r"'data.path'=.*nope\*.jsonl.*no file"):
        Batches(data_cfg(str(tmp_path / "nope*.jsonl")), TOK, "train", 0, 4)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match="empty.jsonl: the files hold no records"):
        Batches(data_cfg(str(tmp_path / "empty.jsonl")), TOK, "train", 0, 4)


def test_malformed_line_errors_with_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in problems(5)) + "{oops\n")
    with pytest.raises(DataError, match=r"d\.jsonl:6: not valid JSON"):
        read(Batches(data_cfg(str(path), "data.shuffle=false"), TOK, "train", 0, 3), 2)


def test_bad_records_are_skipped_with_a_counted_warning_then_stop(tmp_path, caplog):
    rows = [json.dumps(r) for r in problems(100)]
    rows[10] = "{oops"
    rows[20] = json.dumps({"prompt": 3, "completion": "x"})  # wrong type
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(rows) + "\n")
    cfg = data_cfg(str(path), "data.shuffle=false", "data.skip_bad_records=true", "data.max_bad_fraction=0.05")
    with caplog.at_level(logging.WARNING, logger="stack.data.encode"):
        got = sum(read(Batches(cfg, TOK, "train", 0, 7), 14), [])
    assert len(got) == 98 and "20" not in got and "40" not in got  # records 10 and 20 dropped
    messages = [r.getMessage() for r in caplog.records]
    assert any("skipped bad record 1 " in m and "d.jsonl:11: not valid JSON" in m for m in messages)
    assert any("skipped bad record 2 " in m and "d.jsonl:21" in m and "'prompt'" in m for m in messages)
    for i in range(30, 40):
        rows[i] = "[1]"  # 12 bad of 100 > 5 %
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(DataError, match=r"more than data.max_bad_fraction=0.05.*d\.jsonl:\d+"):
        read(Batches(cfg, TOK, "train", 0, 7), 14)


def test_long_example_with_truncation_off_names_the_record(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", problems(3) + [{"prompt": "x" * 40, "completion": "y"}])
    with pytest.raises(DataError, match=r"d\.jsonl:4: 43 tokens > 17 \(data.seq_len=16\) with data.truncation=error"):
        read(Batches(data_cfg(path, "data.truncation=error", "data.shuffle=false"), TOK, "train", 0, 2), 2)


def test_preference_and_prompt_batches(tmp_path):
    prefs = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}] * 4)
    cfg = make_cfg(["data=jsonl_prefs", f"data.path={prefs}", f"data.eval_path={prefs}", "data.seq_len=12"]).data
    batch = next(iter(Batches(cfg, TOK, "train", 0, 2)))
    assert batch["inputs"].shape == (2, 2, 12) and batch["segment_ids"].shape == (2, 2, 12)
    chosen, rejected = batch["targets"][0]
    assert TOK.decode(chosen[batch["loss_mask"][0, 0] > 0].tolist()) == "2"
    assert TOK.decode(rejected[batch["loss_mask"][0, 1] > 0].tolist()) == "3"
    record = {"prompt": [{"role": "user", "content": "1+1="}], "answer": 2, "solution": "1+1 is 2", "level": [1]}
    prompts = write_jsonl(tmp_path / "q.jsonl", [record] * 4)
    cfg = make_cfg(["data=jsonl_prompts", f"data.path={prompts}", f"data.eval_path={prompts}", "data.seq_len=24"]).data
    batch = next(iter(Batches(cfg, TOK, "train", 0, 2)))
    text = "user: 1+1=\nassistant: "
    n = len(text) + 1
    assert batch["prompt_mask"][0].tolist() == [0] * (24 - n) + [1] * n  # left-padded
    assert TOK.decode(batch["prompt_ids"][0].tolist()) == text and batch["answer"].tolist() == ["2", "2"]
    fields = {"prompt": record["prompt"], "solution": "1+1 is 2", "level": [1]}  # for the rewards: TRL's columns
    assert [json.loads(f) for f in batch["fields"]] == [fields] * 2
