"""Record sources over real files: JSON lines, Parquet, ArrayRecord and a saved HF dataset."""

import json
import os
import pickle
import re

import grain
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from array_record.python.array_record_module import ArrayRecordWriter

from stack.data.sources import FILE_SOURCES, expand_paths
from stack.errors import DataError

RECORDS = [
    {"prompt": f"{a}+{a * 3}=", "completion": str(a * 4)} if a % 3 else
    {"prompt": f"Say «{a}» twice.", "completion": f"{a} {a}\nnext"}
    for a in range(20)
]


def write_arrayrecord(path: str, payloads: list[bytes]) -> None:
    writer = ArrayRecordWriter(path, "group_size:1")
    for payload in payloads:
        writer.write(payload)
    writer.close()


def save_hf(path: str, **splits: list[dict]) -> None:
    import datasets  # dev dependency: a missing install fails the test

    datasets.disable_progress_bars()
    if list(splits) == ["records"]:
        datasets.Dataset.from_list(splits["records"]).save_to_disk(path)
    else:
        datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in splits.items()}).save_to_disk(path)


@pytest.fixture
def data(tmp_path) -> dict[str, tuple[str, list[str]]]:
    """kind -> (path spec for expand_paths, the expected `_where` of each record)."""
    d = str(tmp_path)
    jsonl = os.path.join(d, "d.jsonl")
    with open(jsonl, "w") as f:
        f.write("\n".join(json.dumps(r) for r in RECORDS[:7]) + "\n\n")  # a blank line is skipped
        f.write("\n".join(json.dumps(r) for r in RECORDS[7:]) + "\n")
    parquet = [os.path.join(d, f"part-{k}.parquet") for k in range(2)]
    pq.write_table(pa.Table.from_pylist(RECORDS[:11]), parquet[0], row_group_size=3)
    pq.write_table(pa.Table.from_pylist(RECORDS[11:]), parquet[1], row_group_size=3)
    arrayrecord = [os.path.join(d, f"shard-{k}.array_record") for k in range(2)]
    write_arrayrecord(arrayrecord[0], [json.dumps(r).encode() for r in RECORDS[:8]])
    write_arrayrecord(arrayrecord[1], [json.dumps(r).encode() for r in RECORDS[8:]])
    hf = os.path.join(d, "hf")
    save_hf(hf, records=RECORDS)
    return {
        "jsonl": (jsonl, [f"{jsonl}:{n}" for n in [*range(1, 8), *range(9, 22)]]),
        "parquet": (os.path.join(d, "part-*.parquet"),
                    [f"{parquet[0]}:row {n}" for n in range(11)]
                    + [f"{parquet[1]}:row {n}" for n in range(9)]),
        "arrayrecord": ([os.path.join(d, "shard-*.array_record")],
                        [f"{arrayrecord[0]}:record {n}" for n in range(8)]
                        + [f"{arrayrecord[1]}:record {n}" for n in range(12)]),
        "hf_disk": (hf, [f"{hf}:row {n}" for n in range(20)]),
    }


def strip(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "_where"}


@pytest.mark.parametrize("kind", sorted(FILE_SOURCES))
def test_same_records_in_order_with_where(data, kind):
    spec, wheres = data[kind]
    src = FILE_SOURCES[kind](expand_paths(spec))
    records = [src[i] for i in range(len(src))]
    assert [strip(r) for r in records] == RECORDS
    assert [r["_where"] for r in records] == wheres
    assert strip(src[-1]) == RECORDS[-1]
    with pytest.raises(IndexError):
        src[len(src)]


@pytest.mark.parametrize("kind", sorted(FILE_SOURCES))
def test_grain_shuffle_and_pickle(data, kind):
    src = FILE_SOURCES[kind](expand_paths(data[kind][0]))
    ds = grain.MapDataset.source(src).shuffle(seed=0)
    shuffled = [strip(ds[i]) for i in range(len(ds))]
    key = lambda r: json.dumps(r, sort_keys=True)  # noqa: E731
    assert shuffled != RECORDS and sorted(shuffled, key=key) == sorted(RECORDS, key=key)
    clone = pickle.loads(pickle.dumps(src))  # after accesses: open readers and caches
    assert [clone[i] for i in (0, 13, 19)] == [src[i] for i in (0, 13, 19)]


class CountedParquet(FILE_SOURCES["parquet"]):
    """The Parquet source, counting the row groups it reads from disk."""

    def __init__(self, paths: list[str]):
        super().__init__(paths)
        self.loads = 0

    def _load(self, what):
        self.loads += 1
        return super()._load(what)


def test_a_shuffled_parquet_epoch_reads_each_row_group_once_within_the_cache_budget(data):
    """7 row groups in two files: two shuffled epochs read each group from disk once (a cache of
    4 groups reloaded about every other record); over the byte budget the oldest group goes."""
    paths = expand_paths(data["parquet"][0])
    order = [i for seed in (0, 1) for i in grain.MapDataset.range(len(RECORDS)).shuffle(seed=seed)]
    group = [*(i // 3 for i in range(11)), *(4 + i // 3 for i in range(9))]  # row_group_size=3 in each file
    src = CountedParquet(paths)
    assert [strip(src[i]) for i in order] == [RECORDS[i] for i in order] and src.loads == 7
    one = CountedParquet(paths)
    one.cache_bytes = 1  # one group at a time: every change of group reloads
    assert [strip(one[i]) for i in order] == [RECORDS[i] for i in order]
    assert one.loads == 1 + sum(group[a] != group[b] for a, b in zip(order, order[1:], strict=False))


def test_malformed_arrayrecord_record_names_file_and_record(tmp_path):
    path = str(tmp_path / "bad.array_record")
    good = [json.dumps(r).encode() for r in RECORDS[:3]]
    write_arrayrecord(path, [*good, b"{oops", b"[1, 2]", b"\xff\xfe"])
    src = FILE_SOURCES["arrayrecord"]([path])
    assert strip(src[2]) == RECORDS[2]
    with pytest.raises(DataError, match=f"{re.escape(path)}:record 3: not UTF-8 JSON"):
        src[3]
    with pytest.raises(DataError, match=f"{re.escape(path)}:record 4: expected a JSON object, got list"):
        src[4]
    with pytest.raises(DataError, match=f"{re.escape(path)}:record 5"):
        src[5]


def test_empty_files_raise(tmp_path):
    parquet = str(tmp_path / "empty.parquet")
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), parquet)
    with pytest.raises(DataError, match=f"{re.escape(parquet)}: the files hold no records"):
        FILE_SOURCES["parquet"]([parquet])
    arrayrecord = str(tmp_path / "empty.array_record")
    write_arrayrecord(arrayrecord, [])
    with pytest.raises(DataError, match="hold no records"):
        FILE_SOURCES["arrayrecord"]([arrayrecord])


@pytest.mark.parametrize("kind", ["parquet", "arrayrecord", "hf_disk"])
def test_wrong_format_names_the_file(tmp_path, kind):
    path = tmp_path / "not-data.txt"
    path.write_text("just text\n")
    with pytest.raises(DataError, match=re.escape(str(tmp_path))):
        FILE_SOURCES[kind]([str(path) if kind != "hf_disk" else str(tmp_path)])


def test_dataset_dict_dir_names_the_splits(tmp_path):
    path = str(tmp_path / "dd")
    save_hf(path, train=RECORDS[:15], test=RECORDS[15:])
    with pytest.raises(DataError, match=r"splits train, test; point at one split's folder"):
        FILE_SOURCES["hf_disk"]([path])
    assert [strip(r) for r in FILE_SOURCES["hf_disk"]([os.path.join(path, "test")])] == RECORDS[15:]


def test_jsonl_invalid_utf8_and_a_directory_name_the_file(tmp_path):
    """Hardening (issue 15, item 8): both were tracebacks (UnicodeDecodeError, IsADirectoryError)."""
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"prompt": "1+1=", "completion": "2"}\n{"prompt": "caf\xe9", "completion": "x"}\n')
    src = FILE_SOURCES["jsonl"]([str(path)])
    with pytest.raises(DataError, match=re.escape(f"{path}:2: not UTF-8 text (byte b'\\xe9' at column 16)")):
        src[1]
    with pytest.raises(DataError, match=re.escape(f"{tmp_path}: a directory, not a JSON-lines file")):
        FILE_SOURCES["jsonl"]([str(tmp_path)])


def test_a_parquet_file_or_a_saved_dataset_read_as_jsonl_names_the_source_to_set(tmp_path):
    """Before: 'uf.parquet:2: not UTF-8 text (byte b'\\x80' ...)' and 'point data.path at its files'."""
    parquet, saved = str(tmp_path / "uf.parquet"), str(tmp_path / "saved")
    pq.write_table(pa.Table.from_pylist(RECORDS[:3]), parquet)
    save_hf(saved, records=RECORDS[:3])
    with pytest.raises(DataError, match=re.escape(f"{parquet}: a Parquet file, read as JSON lines (data.source=jsonl); "
                                                  "set data.source=parquet.")):
        FILE_SOURCES["jsonl"]([parquet])
    with pytest.raises(DataError, match=re.escape(f"{saved}: a directory, not a JSON-lines file; it is a dataset "
                                                  "saved with save_to_disk: set data.source=hf_disk.")):
        FILE_SOURCES["jsonl"]([saved])


def test_jsonl_reads_are_the_same_from_many_threads_and_over_many_files(tmp_path, monkeypatch):
    """Records are positional reads of files kept open: 4 threads reading the shuffled records of
    5 files at once (more files than the source keeps open: 2) read exactly the records, and
    the last line of a file without a newline reads whole."""
    from concurrent.futures import ThreadPoolExecutor

    from stack.data.sources import JsonlSource

    monkeypatch.setattr(JsonlSource, "open_files", 2)
    paths = [str(tmp_path / f"part-{k}.jsonl") for k in range(5)]
    for k, path in enumerate(paths):
        with open(path, "w") as f:
            f.write("\n".join(json.dumps(r) for r in RECORDS[4 * k:4 * k + 4]))  # no final newline
    src = JsonlSource(paths)
    order = [(7 * i) % len(src) for i in range(len(src))] * 200
    with ThreadPoolExecutor(4) as pool:
        read = list(pool.map(lambda i: strip(src[i]), order))
    assert read == [RECORDS[i] for i in order]
