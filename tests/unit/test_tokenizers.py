"""Tokenizers from real files: SentencePiece models and a Hugging Face tokenizer.json."""

import os
import pickle
import random

import pytest
import sentencepiece as spm

from stack.data.tokenizers import HFTokenizer, SentencePieceTokenizer, make_tokenizer
from stack.errors import ConfigError

WORDS = ["cat", "dog", "sat", "on", "the", "mat", "ran", "to", "a", "red", "big", "12", "+", "7="]
TEXTS = ["the red cat sat on the mat", "a big dog ran to 12 + 7=", "tac dog"]


@pytest.fixture
def corpus(tmp_path) -> str:
    rng = random.Random(0)
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(300)))
    return str(path)


def train_sp(corpus: str, prefix: str, **ids: int) -> str:
    with open(os.devnull, "w") as quiet:
        spm.SentencePieceTrainer.train(input=corpus, model_prefix=prefix, vocab_size=60,
                                       model_type="bpe", logstream=quiet, **ids)
    return prefix + ".model"


def test_sentencepiece_matches_the_reference(corpus, tmp_path):
    path = train_sp(corpus, str(tmp_path / "sp"), pad_id=3)
    ref = spm.SentencePieceProcessor(model_file=path)
    tok = make_tokenizer(path)
    assert isinstance(tok, SentencePieceTokenizer)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (ref.bos_id(), ref.eos_id(), ref.pad_id()) == (1, 2, 3)
    assert tok.vocab_size == ref.get_piece_size() == 60
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == ref.encode(text) and tok.bos_id not in ids and tok.eos_id not in ids
        assert tok.decode(ids) == ref.decode(ids) == text
        assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id]) == text
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.encode(TEXTS[0]) == tok.encode(TEXTS[0]) and clone.pad_id == 3


def test_sentencepiece_ids_follow_the_model(corpus, tmp_path):
    path = train_sp(corpus, str(tmp_path / "tokenizer"), unk_id=3, bos_id=0, eos_id=1, pad_id=-1)
    tok = make_tokenizer(str(tmp_path))  # a directory holding tokenizer.model
    assert isinstance(tok, SentencePieceTokenizer) and tok.path == path
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 1)  # no pad piece: pad is eos
    no_eos = train_sp(corpus, str(tmp_path / "no_eos"), eos_id=-1)
    with pytest.raises(ConfigError, match="no end-of-sequence"):
        make_tokenizer(no_eos)
    junk = tmp_path / "junk.model"
    junk.write_text("not a model")
    with pytest.raises(ConfigError, match="not a SentencePiece model"):
        make_tokenizer(str(junk))


def test_missing_tokenizer_lists_the_options(tmp_path):
    for spec in (str(tmp_path / "missing.model"), str(tmp_path)):
        with pytest.raises(ConfigError, match=r"'byte'.*tokenizer\.json.*SentencePiece \.model"):
            make_tokenizer(spec)


def test_hf_tokenizer_json_special_ids(corpus, tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    ref = Tokenizer(models.BPE())
    ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    ref.decoder = decoders.ByteLevel()
    ref.train([corpus], trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"],
                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    ref.save(str(tmp_path / "tokenizer.json"))
    tok = make_tokenizer(str(tmp_path))
    assert isinstance(tok, HFTokenizer) and tok.vocab_size == ref.get_vocab_size()
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == tuple(ref.token_to_id(t) for t in ("<s>", "</s>", "<pad>"))
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False).ids and tok.decode(ids) == text
