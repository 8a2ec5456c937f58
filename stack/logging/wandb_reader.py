"""Reader for offline wandb runs (the `run-<id>.wandb` transaction log).

wandb has no public reader for offline runs, and the pinned wandb 0.31 no longer ships
its Python datastore reader (the file is written by the Go `wandb-core`). This module
therefore relies on wandb internals of the pinned version: the file format (a 7-byte
`:W&B` header, then LevelDB-log chunks in 32 KiB blocks with a CRC32 seeded with the
chunk type) and the protobuf schema `wandb.proto.wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from wandb.proto.wandb_internal_pb2 import Record

_FILE_HEADER = struct.Struct("<4sHB")  # ident, magic, version
_EXPECTED_HEADER = (b":W&B", 0xBEE1, 0)
_CHUNK_HEADER = struct.Struct("<IHB")  # crc32, length, chunk type
_BLOCK_SIZE = 32 * 1024
_FULL, _FIRST, _LAST = 1, 2, 4  # 3 is MIDDLE
_INTERNAL_KEYS = {"_wandb", "_runtime", "_timestamp"}  # wandb bookkeeping, dropped


def read_offline_run(run_dir_or_file: str | os.PathLike) -> dict[str, Any]:
    """Reads an offline run.

    Args:
      run_dir_or_file: a `run-*.wandb` file, the `offline-run-*` folder holding it, or a
        folder with `offline-run-*` folders directly or under `wandb/` (the newest wins).

    Returns:
      `{"id", "config", "history", "summary", "group", "name", "job_type", "tags"}`: config and summary as nested
      dicts of plain values, history as a list of `{"_step": int, metric: value}` rows
      (nested metric keys joined with "."), group None when unset. Whole floats come
      back as ints (wandb-core writes 1.0 as `1`).
    """
    path = _find_wandb_file(Path(run_dir_or_file))
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    run: dict[str, Any] = {"id": None, "config": config, "history": [], "summary": summary, "group": None,
                           "name": None, "job_type": None, "tags": []}
    for record in _records(path.read_bytes(), 0, path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run["id"] = record.run.run_id
            run["group"] = record.run.run_group or None
            run["name"], run["job_type"] = record.run.display_name or None, record.run.job_type or None
            run["tags"] = list(record.run.tags)
            _apply(config, record.run.config.update, record.run.config.remove)
        elif kind == "config":
            _apply(config, record.config.update, record.config.remove)
        elif kind == "summary":
            _apply(summary, record.summary.update, record.summary.remove)
        elif kind == "history":
            row = {".".join(_key(item)): json.loads(item.value_json) for item in record.history.item}
            row.setdefault("_step", record.history.step.num)
            run["history"].append({k: v for k, v in row.items() if k.split(".")[0] not in _INTERNAL_KEYS})
    return run


def is_finished(wandb_file: str | os.PathLike) -> bool:
    """Whether a transaction log ends with the run's exit record.

    wandb-core buffers the file and writes it out when the run's stream closes, which
    happens shortly after `run.finish()` returns. Reads only the last two blocks.
    """
    path = Path(wandb_file)
    with path.open("rb") as f:
        start = max(0, (f.seek(0, os.SEEK_END) - 1) // _BLOCK_SIZE - 1) * _BLOCK_SIZE
        f.seek(start)
        records = list(_records(f.read(), start, path))
    return bool(records) and records[-1].WhichOneof("record_type") == "exit"


def _find_wandb_file(path: Path) -> Path:
    if path.is_file():
        return path
    found = list(path.glob("run-*.wandb"))
    if not found:
        runs = [*path.glob("offline-run-*/run-*.wandb"), *path.glob("wandb/offline-run-*/run-*.wandb")]
        # Folder names are offline-run-<YYYYmmdd_HHMMSS>-<id>[-<n>]: order by time, then mtime.
        found = sorted(runs, key=lambda p: (p.parent.name.split("-")[2], p.stat().st_mtime_ns))[-1:]
    if not found:
        raise FileNotFoundError(f"no offline wandb run under {path}")
    return found[0]


def _records(data: bytes, offset: int, path: Path) -> Iterator[Record]:
    """Parses records from `data`, read from a block-aligned `offset` of the file.

    Skips the pieces of a record begun before `offset`; stops quietly at a truncated tail.
    """
    pos = 0
    if offset == 0:
        if len(data) >= _FILE_HEADER.size and _FILE_HEADER.unpack_from(data) != _EXPECTED_HEADER:
            raise ValueError(f"{path}: not a wandb transaction log of the supported version")
        pos = _FILE_HEADER.size
    parts: list[bytes] | None = None
    while True:
        block_left = _BLOCK_SIZE - pos % _BLOCK_SIZE
        if block_left < _CHUNK_HEADER.size:  # zero-padded block trailer
            pos += block_left
        if pos + _CHUNK_HEADER.size > len(data):
            return
        crc, length, chunk_type = _CHUNK_HEADER.unpack_from(data, pos)
        start = pos + _CHUNK_HEADER.size
        chunk = data[start : start + length]
        if chunk_type == 0 or len(chunk) < length:
            return
        if zlib.crc32(chunk, zlib.crc32(bytes([chunk_type]))) != crc:
            raise ValueError(f"{path}: corrupt record at byte {offset + pos}")
        pos = start + length
        if chunk_type in (_FULL, _FIRST):
            parts = []
        if parts is None:
            continue
        parts.append(chunk)
        if chunk_type in (_FULL, _LAST):
            record = Record()
            record.ParseFromString(b"".join(parts))
            parts = None
            yield record


def _key(item: Any) -> list[str]:
    return [item.key] if item.key else list(item.nested_key)


def _apply(target: dict[str, Any], updates: Iterable[Any], removes: Iterable[Any]) -> None:
    """Applies config/summary update and remove items to a nested dict."""
    for item in updates:
        keys = _key(item)
        if keys[0] in _INTERNAL_KEYS:
            continue
        *parents, last = keys
        node = target
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = json.loads(item.value_json)
    for item in removes:
        *parents, last = _key(item)
        node = target
        for key in parents:
            node = node.get(key, {})
        node.pop(last, None)
