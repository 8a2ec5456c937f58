"""Grain pipelines: source -> seeded per-epoch shuffle -> shard -> encode -> [pack] -> batch.

Train data repeats forever; epoch e is shuffled with a permutation drawn from (seed, e).
Each process reads every `jax.process_count()`-th record of the shuffled stream, so processes
see disjoint data. The iterator is a Grain `DatasetIterator`: `get_state()` / `set_state()`
resume it exactly (the checkpoint stores that state).

Columns computed once per record before training (e.g. DPO reference log-probs,
`Batches.with_columns`) are tables indexed by the record's position in the source; each
row carries its record's entries, whatever the shuffle order. Prompt rows always carry
`index`, their record's position (generation keys are derived from it).
"""

from collections.abc import Iterator, Sequence
from typing import Any

import grain
import numpy as np

from stack.data.chat import make_template
from stack.data.encode import Encoder
from stack.data.sources import FILE_SOURCES, arithmetic_problems, expand_paths, fraction_split
from stack.data.tokenizers import Tokenizer
from stack.errors import DataError

PACKED_KEYS = ("inputs", "targets", "loss_mask")


def make_source(cfg: Any, split: str, seed: int) -> Sequence:
    """The random-access records of `split` ("train" or "eval") for `cfg` (the data group)."""
    if cfg.source == "synthetic":
        return arithmetic_problems(cfg.max_operand, split)
    open_files = FILE_SOURCES[cfg.source]
    if split == "eval" and cfg.eval_path:
        return open_files(expand_paths(cfg.eval_path, "data.eval_path"))
    source = open_files(expand_paths(cfg.path))
    return source if cfg.eval_path else fraction_split(source, cfg.eval_fraction, seed, split)


class Tolerant:
    """A source whose unreadable records become {"_error": message} (data.skip_bad_records)."""

    def __init__(self, source: Sequence):
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> dict[str, Any]:
        try:
            return self.source[i]
        except DataError as exc:
            return {"_error": str(exc)}


def _is_kept(row: Any) -> bool:
    return row is not None


class Unpack:
    """Renames Grain's packer output to the loop's keys: segment_ids and positions."""

    def __call__(self, row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {k: row[k] for k in PACKED_KEYS}
        out["segment_ids"] = row["inputs_segment_ids"].astype(np.int32)
        out["positions"] = row["inputs_positions"].astype(np.int32)
        return out


def _pair(index: int, record: Any) -> tuple[int, Any]:
    return index, record


class WithColumns:
    """Encodes an (index, record) pair and adds row `index` of each table to the encoded row."""

    def __init__(self, encoder: Encoder, tables: dict[str, np.ndarray]):
        self.encoder, self.tables = encoder, tables

    def __call__(self, pair: tuple[int, Any]) -> dict[str, np.ndarray] | None:
        index, record = pair  # past the first epoch Grain passes index + epoch * len(source)
        row = self.encoder(record)
        return row if row is None else {**row, **{k: t[index % len(t)] for k, t in self.tables.items()}}


def _records_read(state: Any) -> int:
    """The records a Grain iterator state has read (packing, prefetch and workers nest states)."""
    if isinstance(state, dict):
        if "next_index" in state:
            return state["next_index"]
        return sum(_records_read(v) for v in state.values())
    if isinstance(state, list):
        return sum(_records_read(v) for v in state)
    return 0


class Batches:
    """The batches of one split as numpy dicts (train: forever; eval: one pass)."""

    def __init__(self, cfg: Any, tokenizer: Tokenizer, split: str, seed: int, batch_size: int,
                 shard_index: int = 0, shard_count: int = 1, columns: dict[str, np.ndarray] | None = None):
        self._args = (cfg, tokenizer, split, seed, batch_size, shard_index, shard_count)
        source = make_source(cfg, split, seed)
        if len(source) == 0:
            raise DataError(f"The {split} split of data.path={cfg.path!r} holds no records.")
        self.records, self.shard_count, self.batch_size, self.cfg = len(source), shard_count, batch_size, cfg
        train = split == "train"
        self._source = Tolerant(source) if cfg.skip_bad_records else source
        pack = cfg.packing and cfg.kind in ("text", "sft")
        if cfg.kind == "prompt":  # sampling keys and reward columns need the record's index
            columns = {"index": np.arange(len(source), dtype=np.int32), **(columns or {})}
        template = make_template(cfg.chat_template, cfg.tokenizer)
        self._encoder = Encoder(cfg.kind, tokenizer, template, cfg.seq_len, cfg.truncation,
                                pack, cfg.skip_bad_records, cfg.max_bad_fraction, len(source),
                                cfg.max_completion_len, cfg.share_prompt, cfg.train_on_input)
        ds = grain.MapDataset.source(self._source)
        if columns:
            ds = ds.map_with_index(_pair)  # the source index, before the shuffle
        if train and cfg.shuffle:
            ds = ds.shuffle(seed=seed)  # a new permutation every epoch
        if train:
            ds = ds.repeat(None)
        ds = ds[shard_index::shard_count]
        ds = ds.map(WithColumns(self._encoder, columns) if columns else self._encoder)
        if cfg.skip_bad_records:
            ds = ds.filter(_is_kept)
        it = ds.to_iter_dataset(self._read_options())
        if pack:
            it = grain.experimental.FirstFitPackIterDataset(
                it, length_struct={k: cfg.seq_len for k in PACKED_KEYS}, num_packing_bins=batch_size,
                seed=seed, shuffle_bins=train).map(Unpack())
        it = it.batch(batch_size, drop_remainder=True)
        if cfg.workers > 0 and train:  # eval splits are read once: no pool, and the same batches
            from absl import flags  # grain 0.2.18 reads absl flags in its workers

            flags.FLAGS.mark_as_parsed()
            it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg.workers))
        elif cfg.prefetch > 0:
            it = grain.experimental.ThreadPrefetchIterDataset(it, prefetch_buffer_size=cfg.prefetch)
        self.dataset = it

    def check_records(self) -> None:
        """Read and encode every record of the split: a malformed one raises its DataError (file:line)."""
        for i in range(len(self._source)):
            self._encoder(self._source[i])

    def _read_options(self) -> grain.ReadOptions:
        threads = self.cfg.read_threads
        return grain.ReadOptions(num_threads=threads, prefetch_buffer_size=8 * threads + 1)

    def with_columns(self, columns: dict[str, np.ndarray]) -> "Batches":
        """The same pipeline whose rows also carry `columns` (tables with one entry per source record)."""
        return Batches(*self._args, columns=columns)

    def ordered(self) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """(source indices, batch) over every record of the split once, in source order, unsharded.

        The last batch is padded to `batch_size` by repeating its first row; `indices` has
        only the real rows. Records dropped by `skip_bad_records` are not in any batch.
        """
        ds = grain.MapDataset.source(self._source).map_with_index(_pair)
        ds = ds.map(WithColumns(self._encoder, {"index": np.arange(self.records)}))
        if self.cfg.skip_bad_records:
            ds = ds.filter(_is_kept)
        for batch in ds.to_iter_dataset(self._read_options()).batch(self.batch_size, drop_remainder=False):
            indices = batch.pop("index")
            pad = self.batch_size - len(indices)
            if pad:
                batch = {k: np.concatenate([v, np.repeat(v[:1], pad, axis=0)]) for k, v in batch.items()}
            yield indices, batch

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        """A fresh Grain iterator (with get_state / set_state) from the start."""
        return iter(self.dataset)

    def epoch(self, state: dict[str, Any]) -> float:
        """Epochs of the split read so far (records read / records), from an iterator state."""
        return _records_read(state) * self.shard_count / self.records

    def take(self, n: int) -> list[dict[str, np.ndarray]]:
        """The first `n` batches (fewer if the split is shorter)."""
        out = []
        it = iter(self)
        for batch in it:
            out.append(batch)
            if len(out) == n:
                break
        if hasattr(it, "close"):
            it.close()
        return out
