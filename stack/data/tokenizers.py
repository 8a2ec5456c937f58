"""Tokenizers: a built-in byte-level one, local Hugging Face tokenizer.json and SentencePiece models."""

import json
import os
from typing import Any, Protocol

from stack.errors import ConfigError, short


class Tokenizer(Protocol):
    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes shifted by 3: pad=0, bos=1, eos=2, byte b -> b + 3 (vocab 259)."""

    pad_id, bos_id, eos_id = 0, 1, 2
    offset = 3
    vocab_size = 256 + offset

    def encode(self, text: str) -> list[int]:
        return [b + self.offset for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`; specials and ids past the vocabulary (a larger model vocab) are skipped."""
        data = bytes(i - self.offset for i in ids if self.offset <= i < self.vocab_size)
        return data.decode("utf-8", errors="replace")


_BOS = ("<|begin_of_text|>", "<s>", "<bos>", "[BOS]")
_EOS = ("<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>", "[EOS]")
_PAD = ("<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>")


class HFTokenizer:
    """A local Hugging Face `tokenizer.json` (via `tokenizers`); specials found by name."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer as _Tok  # only for tokenizer.json files

        self._tok = _Tok.from_file(path)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        vocab = self._tok.get_vocab(with_added_tokens=True)
        find = lambda names: next((vocab[n] for n in names if n in vocab), None)  # noqa: E731
        bos, eos = find(_BOS), find(_EOS)
        if eos is None:
            raise ConfigError(
                f"Tokenizer {path!r} has none of the known end-of-sequence tokens {_EOS}; "
                "add one to its added_tokens."
            )
        self.eos_id = eos
        self.bos_id = bos if bos is not None else eos
        pad = find(_PAD)
        self.pad_id = pad if pad is not None else eos

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and each token's [start, end) characters in `text`."""
        enc = self._tok.encode(text, add_special_tokens=False)
        return enc.ids, enc.offsets

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode([i for i in ids if i < self.vocab_size])  # a model vocab may be larger


class SentencePieceTokenizer:
    """A local SentencePiece `.model` file; bos/eos/pad as the model sets them (no pad: eos)."""

    def __init__(self, path: str):
        import sentencepiece as spm  # only for SentencePiece models

        self.path = path
        try:
            self._sp = spm.SentencePieceProcessor(model_file=path)
        except (OSError, RuntimeError) as exc:
            raise ConfigError(f"Tokenizer {path!r}: not a SentencePiece model ({exc}).") from None
        self.vocab_size = self._sp.get_piece_size()
        self.eos_id = self._sp.eos_id()
        if self.eos_id < 0:
            raise ConfigError(
                f"Tokenizer {path!r} has no end-of-sequence piece; train it with eos_id >= 0."
            )
        self.bos_id = self._sp.bos_id() if self._sp.bos_id() >= 0 else self.eos_id
        self.pad_id = self._sp.pad_id() if self._sp.pad_id() >= 0 else self.eos_id

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self._sp.decode([int(i) for i in ids if i < self.vocab_size])  # a model vocab may be larger

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])
        _model_specials(self, os.path.dirname(state["path"]))


def make_tokenizer(spec: str) -> Tokenizer:
    """`byte`, a Hugging Face tokenizer.json or a SentencePiece .model (or a directory holding one)."""
    if spec == "byte":
        return ByteTokenizer()
    path = spec
    if os.path.isdir(spec):
        path = os.path.join(spec, "tokenizer.json")
        if not os.path.isfile(path) and os.path.isfile(os.path.join(spec, "tokenizer.model")):
            path = os.path.join(spec, "tokenizer.model")
    if not os.path.isfile(path):
        raise ConfigError(
            f"'data.tokenizer'={spec!r}: no such file. Use 'byte' (built in), the path of a local "
            "Hugging Face tokenizer.json, or of a SentencePiece .model file (a directory holding "
            "tokenizer.json or tokenizer.model works too; nothing is downloaded)."
        )
    kind = "a SentencePiece .model" if path.endswith(".model") else "a Hugging Face tokenizer.json"
    try:
        tok = SentencePieceTokenizer(path) if path.endswith(".model") else HFTokenizer(path)
        return _model_specials(tok, os.path.dirname(path))
    except ConfigError:
        raise
    except Exception as exc:  # the tokenizers / sentencepiece libraries raise plain Exceptions
        why = short((str(exc).strip().splitlines() or [type(exc).__name__])[0], 200)
        raise ConfigError(f"'data.tokenizer'={spec!r}: {path} cannot be read as {kind} ({why}). The file is "
                          "corrupt or of another kind: re-export it, or use 'byte' (built in).") from None


def dir_tokenizer(root: str) -> Tokenizer:
    """The tokenizer of a Hugging Face model dir: its tokenizer.json, else the byte tokenizer."""
    return make_tokenizer(root) if os.path.isfile(os.path.join(root, "tokenizer.json")) else ByteTokenizer()


def _model_specials(tok: Tokenizer, root: str) -> Tokenizer:
    """In a Hugging Face model dir, the bos/eos ids of its generation_config.json, else its
    config.json, win over the names found. A list of eos ids (Llama 3 Instruct's: end of text,
    end of message, end of turn) is kept whole as `eos_ids`, where generation stops (`stop_ids`);
    its first is `eos_id`, the one training appends."""
    for name in ("config.json", "generation_config.json"):  # the second wins
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            config = json.load(f)
        bos, eos = config.get("bos_token_id"), config.get("eos_token_id")
        if isinstance(bos, int) and 0 <= bos < tok.vocab_size:
            tok.bos_id = bos
        eos = [i for i in (eos if isinstance(eos, list) else [eos]) if isinstance(i, int) and 0 <= i < tok.vocab_size]
        if eos:
            tok.eos_id, tok.eos_ids = eos[0], tuple(eos)
    return tok


def stop_ids(tok: Tokenizer) -> tuple[int, ...]:
    """The ids generation stops at: every eos id of the tokenizer's model dir, else its `eos_id`."""
    return tuple(getattr(tok, "eos_ids", ()) or (tok.eos_id,))
