"""The Grain transform that turns a record into token rows of a fixed length.

Rows hold `seq_len + 1` tokens: BOS, the record's pieces, EOS (a conversation rendered by the
tokenizer's own chat template holds its specials itself: nothing is added, and a tokenizer with
offsets encodes the whole text at once, as transformers does); `inputs` and `targets` are the
two shifted views. `loss_mask` is 1 where the target carries loss (sft: the completion, or
every token with `train_on_input=True`); `segment_ids` is 1 on real inputs and 0 on
padding; `positions` count from 0. With `pack=True` text/sft rows are left unpadded for
Grain's first-fit packer, which sets per-segment ids and positions.

Truncation (`data.truncation`) applies to a sequence longer than `seq_len + 1` tokens:
`keep_start` drops tokens from the end (the EOS and the completion's tail), `keep_end` drops
them from the start (BOS and the prompt's head: keeps the completion), `error` (truncation
off) raises a DataError naming the record.

Preference rows with `max_completion_len` K (TRL DPOConfig max_completion_length): a completion
keeps its first K loss tokens (a longer one loses its tail and EOS) before the row is truncated,
and the pair carries the positions, targets and flags of those tokens, or with `share_prompt`
becomes one row with the prompt once (stack.data.shared_prompt).
"""

import logging
from typing import Any

import numpy as np

from stack.data import records
from stack.data.chat import TEMPLATES
from stack.data.records import is_chat
from stack.data.shared_prompt import completion_arrays, shared_row
from stack.data.tokenizers import Tokenizer
from stack.errors import DataError

log = logging.getLogger(__name__)
Row = dict[str, np.ndarray]


class Encoder:
    """Picklable record -> row transform for one `data.kind`; None for a skipped bad record.

    With `skip_bad=True` a bad record is dropped with a counted warning; the run stops once
    more than `max_bad_fraction` of the records read (never counted over fewer than
    min(1000, n_records)) were bad.
    """

    def __init__(self, kind: str, tokenizer: Tokenizer, chat_template: Any, seq_len: int,
                 truncation: str, pack: bool = False, skip_bad: bool = False,
                 max_bad_fraction: float = 0.0, n_records: int = 1000, max_completion_len: int | None = None,
                 share_prompt: bool = False, train_on_input: bool = False):
        self.kind, self.tok = kind, tokenizer
        # a built-in template's name, or a template object (stack.data.chat.make_template)
        self.template = TEMPLATES[chat_template] if isinstance(chat_template, str) else chat_template
        self.seq_len, self.truncation, self.pack = seq_len, truncation, pack
        self.skip_bad, self.max_bad_fraction, self.window = skip_bad, max_bad_fraction, min(1000, n_records)
        self.seen = self.bad = self.cuts = 0
        self.max_completion, self.share_prompt = max_completion_len, share_prompt
        self.train_on_input = train_on_input

    def __call__(self, record: dict[str, Any]) -> Row | None:
        self.seen += 1
        where = record.get("_where", "record")
        try:
            if "_error" in record:  # the source could not read it (see pipeline.Tolerant)
                raise DataError(record["_error"])
            return self.encode(record, where)
        except DataError as exc:
            if not self.skip_bad:
                raise
            self.bad += 1
            if self.bad > self.max_bad_fraction * max(self.seen, self.window):
                raise DataError(
                    f"{self.bad} of {self.seen} records read were bad, more than "
                    f"data.max_bad_fraction={self.max_bad_fraction}; the last: {exc} "
                    "Fix the data or raise data.max_bad_fraction."
                ) from None
            if self.bad <= 10 or self.bad % 100 == 0:
                log.warning("skipped bad record %d (data.skip_bad_records=true): %s", self.bad, exc)
            return None

    def encode(self, record: dict[str, Any], where: str) -> Row:
        """The row(s) of one record; raises DataError if it does not fit its kind."""
        wrap = not (self.template.own_specials and is_chat(record))  # else the template wrote the specials
        if self.kind == "preference":
            return {**self._pair(record, where, wrap), "margin": _margin(record, where)}
        if self.kind == "prompt":
            pieces, answer = records.prompt_pieces(record, where, self.template)
            return self._prompt_row(pieces, answer, records.reward_fields(record), where, wrap)
        pieces = (records.text_pieces(record, where) if self.kind == "text"
                  else records.sft_pieces(record, where, self.template, self.train_on_input))
        if self.train_on_input:  # torchtune's train_on_input; TRL SFTTrainer with completion_only_loss off
            pieces = [(text, True) for text, _ in pieces]
        return self._row(*self._tokens(pieces, where, wrap=wrap), pad=not self.pack)

    def _tokens(self, pieces: records.Pieces, where: str, eos: bool = True, wrap: bool = True,
                cut: int | None = None) -> tuple[list[int], list[int]]:
        """BOS + pieces (+ EOS) and their loss flags (`wrap=False`: the pieces alone), the
        completion `cut` to that many loss tokens, truncated to a row (a prompt: seq_len)."""
        ids, mask = encode_pieces(self.tok, pieces, whole=not wrap)
        if wrap:
            ids, mask = [self.tok.bos_id] + ids + [self.tok.eos_id] * eos, [0] + mask + [1] * eos
        if cut is not None and sum(mask) > cut:
            self._note_cut(sum(mask), where)
            ids, mask = cut_completion(ids, mask, cut)
        n = self.seq_len + int(eos)  # a row: seq_len + 1 tokens; a prompt: seq_len
        if len(ids) > n:
            if self.truncation == "error":
                raise DataError(
                    f"{where}: {len(ids)} tokens > {n} (data.seq_len={self.seq_len}) with data.truncation=error "
                    "(set data.truncation=keep_start or keep_end, or raise data.seq_len)."
                )
            sl = slice(0, n) if self.truncation == "keep_start" else slice(len(ids) - n, None)
            ids, mask = ids[sl], mask[sl]
        if not any(mask[1:]):
            raise DataError(f"{where}: no token carries loss after truncation to data.seq_len={self.seq_len} "
                            "(raise data.seq_len, use data.truncation=keep_end, or data.skip_bad_records=true).")
        return ids, mask

    def _note_cut(self, n: int, where: str) -> None:
        self.cuts += 1
        if self.cuts <= 10 or self.cuts % 100 == 0:
            log.warning("%s: a completion of %d tokens was cut to data.max_completion_len=%d (cut %d so far; "
                        "raise it to keep whole completions)", where, n, self.max_completion, self.cuts)

    def _row(self, ids: list[int], mask: list[int], pad: bool) -> Row:
        real = len(ids) - 1
        n = self.seq_len + 1 if pad else len(ids)
        tokens = np.full(n, self.tok.pad_id, np.int32)
        tokens[: len(ids)] = ids
        loss = np.zeros(n, np.float32)
        loss[: len(mask)] = mask
        row = {"inputs": tokens[:-1], "targets": tokens[1:], "loss_mask": loss[1:]}
        if pad:
            row["segment_ids"] = (np.arange(n - 1) < real).astype(np.int32)
            row["positions"] = np.arange(n - 1, dtype=np.int32)
        return row

    def _pair(self, record: dict[str, Any], where: str, wrap: bool) -> Row:
        """A preference pair: [2, seq_len] rows, or one shared row (module doc)."""
        sides = [self._tokens(p, where, wrap=wrap, cut=self.max_completion)
                 for p in records.preference_pieces(record, where, self.template)]
        if self.share_prompt:
            k = self.max_completion
            return shared_row(*sides, k, self.seq_len + k, self.tok.pad_id, where)
        rows = [self._row(*side, pad=True) for side in sides]
        if self.max_completion is not None:
            rows = [{**r, **completion_arrays(r["targets"], r["loss_mask"], self.max_completion)} for r in rows]
        return {k: np.stack([rows[0][k], rows[1][k]]) for k in rows[0]}

    def _prompt_row(self, pieces: records.Pieces, answer: str, fields: str, where: str, wrap: bool) -> Row:
        ids, _ = self._tokens([(t, True) for t, _ in pieces], where, eos=False, wrap=wrap)
        pad = self.seq_len - len(ids)  # prompts are left-padded, ready for generation
        return {
            "prompt_ids": np.array([self.tok.pad_id] * pad + ids, np.int32),
            "prompt_mask": np.array([0] * pad + [1] * len(ids), np.int32),
            "answer": np.array(answer),
            "fields": np.array(fields),  # the reward functions' other keyword arguments (JSON)
        }


def encode_pieces(tok: Tokenizer, pieces: records.Pieces, whole: bool = False) -> tuple[list[int], list[int]]:
    """Token ids of the pieces and a 0/1 loss flag per token. `whole`, with a tokenizer that gives
    offsets: the joined text is encoded at once and a token carries loss when its characters
    overlap a loss piece (transformers' assistant mask); else piece by piece."""
    if whole and hasattr(tok, "encode_offsets"):
        text = "".join(t for t, _ in pieces)
        spans, pos = [], 0
        for t, loss in pieces:
            spans += [(pos, pos + len(t))] if loss else []
            pos += len(t)
        ids, offsets = tok.encode_offsets(text)
        return ids, [int(any(a < e and s < b for s, e in spans)) for a, b in offsets]
    ids, mask = [], []
    for text, loss in pieces:
        piece = tok.encode(text)
        ids += piece
        mask += [int(loss)] * len(piece)
    return ids, mask


def cut_completion(ids: list[int], mask: list[int], k: int) -> tuple[list[int], list[int]]:
    """The tokens up to the k-th loss-carrying one (all of them when fewer carry loss)."""
    loss_at = [i for i, m in enumerate(mask) if m]
    end = loss_at[k - 1] + 1 if len(loss_at) > k else len(ids)
    return ids[:end], mask[:end]


def _margin(record: dict[str, Any], where: str) -> np.ndarray:
    """A preference pair's optional `margin` (TRL RewardTrainer's column; 0 when absent)."""
    value = record.get("margin", 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise DataError(f"{where}: 'margin' must be a finite number, got {value!r}.")
    return np.asarray(value, np.float32)
