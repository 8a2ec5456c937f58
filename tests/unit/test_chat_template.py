"""`data.chat_template=tokenizer`: the tokenizer's Jinja template, against transformers'
`apply_chat_template` (text, token ids, assistant mask) on the shipped fixture templates."""

import json
import os
import pickle

import pytest

transformers = pytest.importorskip("transformers", reason="the chat template reference is transformers")

from stack.config.validate import validate  # noqa: E402
from stack.data.chat import make_template  # noqa: E402
from stack.data.encode import Encoder  # noqa: E402
from stack.data.tokenizers import make_tokenizer  # noqa: E402
from stack.errors import ConfigError, DataError  # noqa: E402
from tests.helpers import REPO, make_cfg  # noqa: E402

FIXTURES = os.path.join(REPO, "tests", "fixtures", "chat_templates")
SPECIAL = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|eot_id|>", "<|endoftext|>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
CHAT = [{"role": "system", "content": "Add numbers."}, {"role": "user", "content": "What is 12 + 7?"},
        {"role": "assistant", "content": " It is 19. "}, {"role": "user", "content": "And 3 + 4?"},
        {"role": "assistant", "content": "7"}]


def tokenizer_dir(root, template: str, eos: str, as_file: bool) -> str:
    """A BPE tokenizer.json with chat specials, and the fixture template in tokenizer_config.json
    (or as chat_template.jinja)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [m["content"] for m in CHAT] * 20 + ["system user assistant helpful numbers"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(root / "tokenizer.json"))
    with open(os.path.join(FIXTURES, template)) as f:
        source = f.read()
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": eos, "pad_token": "<pad>"}
    if as_file:
        (root / "chat_template.jinja").write_text(source)
    else:
        config["chat_template"] = source
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return str(root)


@pytest.fixture
def chatml(tmp_path):
    return tokenizer_dir(tmp_path, "chatml_generation.jinja", "<|im_end|>", as_file=False)


@pytest.fixture
def llama3(tmp_path):
    return tokenizer_dir(tmp_path, "llama3_plain.jinja", "<|eot_id|>", as_file=True)


def learned(path: str, row) -> str:
    """The text of the targets that carry loss, specials included."""
    from tokenizers import Tokenizer

    ids = [t for t, m in zip(row["targets"].tolist(), row["loss_mask"], strict=True) if m]
    return Tokenizer.from_file(os.path.join(path, "tokenizer.json")).decode(ids, skip_special_tokens=False)


def encoder(path: str, kind: str, seq_len: int = 200) -> Encoder:
    return Encoder(kind, make_tokenizer(path), make_template("tokenizer", path), seq_len, "keep_start",
                   pack=kind == "sft")


def reference(path: str, messages, **kw) -> dict:
    tok = transformers.AutoTokenizer.from_pretrained(path)
    return tok.apply_chat_template(messages, tokenize=True, return_dict=True, **kw)


def test_sft_ids_and_assistant_mask_equal_transformers(chatml):
    row = encoder(chatml, "sft")({"messages": CHAT})
    ids = [int(row["inputs"][0])] + row["targets"].tolist()
    want = reference(chatml, CHAT, return_assistant_tokens_mask=True)
    assert ids == want["input_ids"]
    assert row["loss_mask"].tolist() == want["assistant_masks"][1:]
    # the generation blocks: trimmed content + end of turn
    assert learned(chatml, row) == "It is 19.<|im_end|>7<|im_end|>"
    text, _ = make_template("tokenizer", chatml).render_text(CHAT)
    assert text == transformers.AutoTokenizer.from_pretrained(chatml).apply_chat_template(CHAT, tokenize=False)


def test_prompt_opens_the_assistant_turn_as_transformers(chatml):
    row = encoder(chatml, "prompt", seq_len=64)({"prompt": CHAT[1:2], "answer": "19"})
    ids = row["prompt_ids"][row["prompt_mask"] > 0].tolist()
    assert ids == reference(chatml, CHAT[1:2], add_generation_prompt=True)["input_ids"]


def test_conversational_preference_pair_is_one_conversation(chatml):
    record = {"prompt": CHAT[:2], "chosen": [{"role": "assistant", "content": "19"}], "rejected": "20"}
    row = Encoder("preference", make_tokenizer(chatml), make_template("tokenizer", chatml), 80, "keep_start")(record)
    for k, completion in enumerate(("19", "20")):
        want = reference(chatml, CHAT[:2] + [{"role": "assistant", "content": completion}],
                         return_assistant_tokens_mask=True)
        n = len(want["input_ids"])
        assert [int(row["inputs"][k][0])] + row["targets"][k][:n - 1].tolist() == want["input_ids"]
        assert row["loss_mask"][k][:n - 1].tolist() == want["assistant_masks"][1:]


@pytest.mark.parametrize("template, eos, learns", [
    ("qwen2_5.jinja", "<|im_end|>", " It is 19. <|im_end|>7<|im_end|>"),
    ("qwen3.jinja", "<|endoftext|>", " It is 19. <|im_end|>7<|im_end|>"),  # a base model's eos: the turn's end
    ("gemma3.jinja", "<eos>", "It is 19.<end_of_turn>7<end_of_turn>")])  # Gemma trims the content
def test_qwen_and_gemma_templates_learn_each_answer_and_its_end_of_turn(template, eos, learns, tmp_path):
    """Their shipped templates (tests/fixtures/chat_templates: TRL's copies of the Hub's) have no
    generation blocks: each assistant content carries loss with the special token that ends its turn."""
    path = tokenizer_dir(tmp_path, template, eos, as_file=True)
    row = encoder(path, "sft")({"messages": CHAT})
    ids = [int(row["inputs"][0])] + row["targets"].tolist()
    assert ids == reference(path, CHAT)["input_ids"]
    assert learned(path, row) == learns


@pytest.mark.parametrize("template", ["chatml", "llama3"])
def test_a_multi_turn_pair_learns_its_completion_only(template, request):
    """TRL's DPOTrainer: the prompt is the conversation so far (its own assistant turn included,
    rendered with the generation prompt), the completion the tokens after it."""
    path = request.getfixturevalue(template)
    record = {"prompt": CHAT[:-1], "chosen": [CHAT[-1]], "rejected": [{"role": "assistant", "content": "8"}]}
    row = Encoder("preference", make_tokenizer(path), make_template("tokenizer", path), 96, "keep_start")(record)
    end = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>"}[template]
    for k, answer in enumerate(("7", "8")):
        side = {"targets": row["targets"][k], "loss_mask": row["loss_mask"][k]}
        assert learned(path, side) == answer + end
        full = reference(path, CHAT[:-1] + [{"role": "assistant", "content": answer}])["input_ids"]
        prompt = reference(path, CHAT[:-1], add_generation_prompt=True)["input_ids"]
        ids = [int(row["inputs"][k][0])] + row["targets"][k][:len(full) - 1].tolist()
        assert full[:len(prompt)] == prompt and ids == full


def test_without_generation_blocks_assistant_content_and_eos_carry_loss(llama3):
    row = encoder(llama3, "sft")({"messages": CHAT})
    ids = [int(row["inputs"][0])] + row["targets"].tolist()
    assert ids == reference(llama3, CHAT)["input_ids"]  # chat_template.jinja beside the tokenizer
    assert learned(llama3, row) == "It is 19.<|eot_id|>7<|eot_id|>"


def test_template_errors_name_the_record_and_encoders_pickle(chatml, tmp_path):
    enc = encoder(chatml, "sft")
    with pytest.raises(DataError, match=r"data.jsonl:3: the chat template of .* refused the messages: "
                                        "Conversation roles must alternate"):
        enc({"messages": [CHAT[1], CHAT[1], CHAT[2]], "_where": "data.jsonl:3"})
    again = pickle.loads(pickle.dumps(enc))  # Grain workers receive a pickled encoder
    assert again({"messages": CHAT})["targets"].tolist() == enc({"messages": CHAT})["targets"].tolist()
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_text(open(os.path.join(chatml, "tokenizer.json")).read())
    with pytest.raises(ConfigError, match="has no chat template"):
        make_template("tokenizer", str(bare))
    with pytest.raises(ConfigError, match="'data.tokenizer'=byte .* has none"):
        validate(make_cfg(["data.chat_template=tokenizer"]))
