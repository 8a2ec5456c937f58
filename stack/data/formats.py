"""Random-access record sources over Parquet, ArrayRecord and saved Hugging Face datasets.

Each source has `len()` and `src[i] -> dict` (one record, plus `"_where"` locating it) and
pickles without open files, so Grain can use it as a source in worker processes.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stack.errors import DataError

if TYPE_CHECKING:
    import pyarrow as pa


class _Segments:
    """Base: records stored one segment (file, row group) after another."""

    def __init__(self, sizes: list[int], paths: list[str]):
        self._starts = [0, *itertools.accumulate(sizes)]
        if not self._starts[-1]:
            raise DataError(f"{', '.join(paths)}: the files hold no records.")

    def __len__(self) -> int:
        return self._starts[-1]

    def _locate(self, i: int) -> tuple[int, int]:
        """(segment, position within it) of record `i` (IndexError when out of range)."""
        i = range(len(self))[i]
        k = bisect.bisect_right(self._starts, i) - 1  # skips empty segments
        return k, i - self._starts[k]


class _ArrowRows(_Segments):
    """Base: segments read as Arrow tables, the most recently used cached per process up to
    `cache_bytes` (thread-safe). A shuffled epoch reads segments in random order: a cache of a
    count (4 row groups) reloaded every other record of an 8-group file."""

    cache_bytes = 512 << 20

    def __init__(self, segments: list[tuple[str, Any, int, int]], paths: list[str]):
        self._segments = segments  # (label, what to load, first row within label, rows)
        self.__setstate__({})
        super().__init__([rows for *_, rows in segments], paths)

    def _load(self, what: Any) -> pa.Table:
        raise NotImplementedError

    def __getitem__(self, i: int) -> dict[str, Any]:
        k, j = self._locate(i)
        label, what, first, _ = self._segments[k]
        where = f"{label}:row {first + j}"
        with self._lock:
            table = self._cache.get(k)
            if table is not None:
                self._cache.move_to_end(k)
        if table is None:
            try:
                table = self._load(what)
            except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
                raise DataError(f"{where}: cannot read ({exc}).") from None
            with self._lock:
                self._cache[k] = table
                while len(self._cache) > 1 and sum(t.nbytes for t in self._cache.values()) > self.cache_bytes:
                    self._cache.popitem(last=False)
        record = table.slice(j, 1).to_pylist()[0]
        record["_where"] = where
        return record

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_cache", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._cache: OrderedDict[int, pa.Table] = OrderedDict()
        self._lock = threading.Lock()


class ParquetSource(_ArrowRows):
    """Records of Parquet files (one per row), indexed by row group from the metadata."""

    def __init__(self, paths: list[str]):
        import pyarrow.parquet as pq  # pyarrow (~0.2 s to import): only for these sources

        segments: list[tuple[str, Any, int, int]] = []
        for path in paths:
            try:
                meta = pq.read_metadata(path)
            except (OSError, ValueError) as exc:
                raise DataError(f"{path}: not a readable Parquet file ({exc}).") from None
            first = 0
            for g in range(meta.num_row_groups):
                rows = meta.row_group(g).num_rows
                segments.append((path, (path, g), first, rows))
                first += rows
        super().__init__(segments, paths)

    def _load(self, what: tuple[str, int]) -> pa.Table:
        import pyarrow.parquet as pq  # as in __init__

        path, group = what
        with pq.ParquetFile(path) as f:
            return f.read_row_group(group)


class HFDiskSource(_ArrowRows):
    """Records of Hugging Face datasets saved with `Dataset.save_to_disk(dir)` (one dir per path).

    Reads the dir's `state.json` and its Arrow stream files directly (no `datasets` import).
    """

    def __init__(self, paths: list[str]):
        segments: list[tuple[str, Any, int, int]] = []
        for path in paths:
            first = 0
            for file in _arrow_files(path):
                rows = self._load(file).num_rows
                segments.append((path, file, first, rows))
                first += rows
        super().__init__(segments, paths)

    def _load(self, what: str) -> pa.Table:
        import pyarrow as pa  # as ParquetSource

        return pa.ipc.open_stream(pa.memory_map(what)).read_all()


def _arrow_files(path: str) -> list[str]:
    """The .arrow files of a dataset saved with `save_to_disk`, from its state.json."""
    splits_file = os.path.join(path, "dataset_dict.json")
    if os.path.isfile(splits_file):
        with open(splits_file) as f:
            splits = json.load(f).get("splits", [])
        raise DataError(
            f"{path}: a DatasetDict with splits {', '.join(splits)}; point at one split's "
            f"folder, e.g. {os.path.join(path, splits[0] if splits else 'train')}."
        )
    try:
        with open(os.path.join(path, "state.json")) as f:
            names = [d["filename"] for d in json.load(f)["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(
            f"{path}: not a dataset saved with Dataset.save_to_disk (state.json: {exc})."
        ) from None
    return [os.path.join(path, name) for name in names]


class ArrayRecordSource(_Segments):
    """Records of ArrayRecord files; each record is one JSON object, UTF-8 encoded."""

    def __init__(self, paths: list[str]):
        from grain.sources import ArrayRecordDataSource  # array_record's reader: only for this source

        self._files: list[tuple[str, Sequence[bytes]]] = []
        for path in paths:
            try:
                self._files.append((path, ArrayRecordDataSource(path)))
            except (OSError, ValueError, RuntimeError) as exc:
                raise DataError(f"{path}: not a readable ArrayRecord file ({exc}).") from None
        super().__init__([len(source) for _, source in self._files], paths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        k, j = self._locate(i)
        path, source = self._files[k]
        where = f"{path}:record {j}"
        try:
            record = json.loads(source[j])
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(f"{where}: not UTF-8 JSON ({exc}).") from None
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}.")
        record["_where"] = where
        return record
