"""Record kinds and chat templates: rendered text and loss flags against hand-written strings."""

import pytest

from stack.data.chat import TEMPLATES
from stack.data.encode import Encoder
from stack.data.records import implicit_prompt, preference_pieces, sft_pieces
from stack.data.tokenizers import ByteTokenizer
from stack.errors import DataError

TOK = ByteTokenizer()
CHAT = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]


def learned(pieces):
    return "".join(t for t, loss in pieces if loss)


def test_llama3_and_chatml_templates_learn_the_end_of_turn():
    llama3 = TEMPLATES["llama3"].render(CHAT)
    assert "".join(t for t, _ in llama3) == (
        "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|>")
    assert learned(llama3) == "yo<|eot_id|>"
    chatml = TEMPLATES["chatml"].render(CHAT)
    assert "".join(t for t, _ in chatml).endswith("<|im_start|>assistant\nyo<|im_end|>\n")
    assert learned(chatml) == "yo<|im_end|>\n"
    opened = TEMPLATES["chatml"].render(CHAT[:2], generation_prompt=True)
    assert "".join(t for t, _ in opened).endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_text_kind_learns_every_token():
    row = Encoder("text", TOK, "simple", 8, "keep_start")({"text": "abc"})
    assert row["loss_mask"].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]  # a, b, c, EOS
    assert row["segment_ids"].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]


def test_sft_learns_the_completion_only_unless_train_on_input():
    """TRL SFTTrainer: completion_only_loss (prompt-completion) / assistant_only_loss (messages) on
    learns the completion and its EOS; off (torchtune's train_on_input), labels are the input ids:
    every target but padding."""
    prompt = {"prompt": "2+2=", "completion": "4"}  # BOS 2 + 2 = 4 EOS: 6 tokens, 5 targets
    chat = {"messages": CHAT}  # "system: S\nuser: hi\nassistant: yo" (the simple template): 30 characters
    for record, completion in ((prompt, "4"), (chat, "yo")):
        only, every = (Encoder("sft", TOK, "simple", 40, "keep_start", train_on_input=flag)(record)
                       for flag in (False, True))
        assert only["inputs"].tolist() == every["inputs"].tolist()
        real = int(every["segment_ids"].sum())
        assert every["loss_mask"].tolist() == [1] * real + [0] * (40 - real)  # targets after BOS, EOS included
        assert only["loss_mask"].sum() == len(completion) + 1 and only["loss_mask"][real - 1] == 1
    assert real == len("system: S\nuser: hi\nassistant: yo") + 1


def test_a_conversation_without_an_assistant_turn_is_learned_only_with_train_on_input():
    """Every token of it carries loss under train_on_input (TRL SFTTrainer, assistant_only_loss
    off); without, nothing would: refused, naming the record and the key that would take it."""
    record = {"messages": CHAT[:2], "_where": "c.jsonl:7"}  # "system: S\nuser: hi\n": 19 characters
    row = Encoder("sft", TOK, "simple", 24, "keep_start", train_on_input=True)(record)
    assert row["loss_mask"].tolist() == [1] * 20 + [0] * 4  # the 19 characters and EOS
    with pytest.raises(DataError, match=r"^c\.jsonl:7: 'messages' has no assistant turn .*data\.train_on_input=true"):
        Encoder("sft", TOK, "simple", 24, "keep_start")(record)


def test_a_text_record_read_as_sft_points_to_the_text_kind():
    with pytest.raises(DataError, match=r"t\.jsonl:3: an sft record needs .* keys: \['text'\]\. .* data\.kind=text"):
        Encoder("sft", TOK, "simple", 8, "keep_start")({"text": "abc", "_where": "t.jsonl:3"})


def test_conversational_preferences_share_the_rendered_prompt():
    rec = {"prompt": CHAT[:2], "chosen": [{"role": "assistant", "content": "4"}],
           "rejected": [{"role": "assistant", "content": "5"}]}
    chosen, rejected = preference_pieces(rec, "p.jsonl:1", TEMPLATES["simple"])
    assert chosen[:-1] == rejected[:-1] and learned(chosen) == "4" and learned(rejected) == "5"
    assert "".join(t for t, _ in chosen) == "system: S\nuser: hi\nassistant: 4"
    row = Encoder("preference", TOK, "simple", 32, "keep_start")(rec)
    assert row["inputs"].shape == (2, 32) and row["loss_mask"].sum(axis=1).tolist() == [2, 2]  # answer + EOS


def test_a_conversational_prompt_s_own_assistant_turns_carry_no_loss():
    """TRL's DPOTrainer and SFTTrainer (completion_only_loss) learn the completion only: a multi-turn
    prompt's earlier assistant turn is context (before, a pair learned it too, and with
    share_prompt the completion began there, so max_completion_len could cut off the answer)."""
    turns = CHAT + [{"role": "user", "content": "2+2?"}]
    four, five = [{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "5"}]
    chosen, rejected = preference_pieces({"prompt": turns, "chosen": four, "rejected": five}, "p", TEMPLATES["simple"])
    assert learned(chosen) == "4" and learned(rejected) == "5"
    assert "".join(t for t, _ in chosen) == "system: S\nuser: hi\nassistant: yo\nuser: 2+2?\nassistant: 4"
    assert learned(sft_pieces({"prompt": turns, "completion": four}, "s", TEMPLATES["chatml"])) == "4<|im_end|>\n"
    assert learned(sft_pieces({"messages": turns + four}, "s", TEMPLATES["chatml"])) == "yo<|im_end|>\n4<|im_end|>\n"
    single = sft_pieces({"prompt": CHAT[:2], "completion": CHAT[2:]}, "s", TEMPLATES["llama3"])
    assert single == sft_pieces({"messages": CHAT}, "s", TEMPLATES["llama3"])


def test_a_pair_without_a_prompt_is_split_where_chosen_and_rejected_first_differ():
    """TRL's implicit prompt (its dataset-formats guide and extract_prompt): the common messages, or
    of strings the common characters less a trailing space, are the prompt."""
    split = implicit_prompt({"chosen": "The sky is blue.", "rejected": "The sky is green."}, "p.jsonl:1")
    assert split == {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}
    four, five = [{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "5"}]
    explicit = {"prompt": CHAT[:2], "chosen": four, "rejected": five}
    implicit = {"chosen": CHAT[:2] + four, "rejected": CHAT[:2] + five}
    assert preference_pieces(implicit, "p.jsonl:1", TEMPLATES["simple"]) == preference_pieces(
        explicit, "p.jsonl:1", TEMPLATES["simple"])
    with pytest.raises(DataError, match=r"p\.jsonl:2: a preference record without 'prompt' .* one of them starts"):
        implicit_prompt({"chosen": "The sky", "rejected": "The sky is"}, "p.jsonl:2")
    # a string prompt beside whole conversations (HuggingFaceH4/ultrafeedback_binarized): TRL's
    # maybe_extract_prompt drops it and splits the conversations; a prompt for assistant-only ones stays
    beside = {"prompt": "hi", **implicit}
    assert preference_pieces(beside, "p.jsonl:3", TEMPLATES["simple"]) == preference_pieces(
        explicit, "p.jsonl:3", TEMPLATES["simple"])
    assert implicit_prompt({"prompt": "hi", "chosen": four, "rejected": five}, "p.jsonl:4")["prompt"] == "hi"


def test_max_completion_len_keeps_the_first_k_completion_tokens_and_indexes_them(caplog):
    """TRL DPOConfig max_completion_length: the completion's tail (and EOS) is dropped, the prompt kept."""
    rec = {"prompt": "pq", "chosen": "abcdef", "rejected": "xy", "_where": "p.jsonl:3"}
    row = Encoder("preference", TOK, "simple", 16, "keep_start", max_completion_len=4)(rec)
    assert "p.jsonl:3: a completion of 7 tokens was cut to data.max_completion_len=4" in caplog.text
    whole = Encoder("preference", TOK, "simple", 16, "keep_start")(rec)
    assert row["inputs"][0][:6].tolist() == [TOK.bos_id, *TOK.encode("pqabc")]
    assert row["targets"][0][:6].tolist() == TOK.encode("pqabcd")
    assert row["loss_mask"][0].tolist() == [0, 0, 1, 1, 1, 1] + [0] * 10  # a, b, c, d: e, f and EOS cut
    assert row["segment_ids"][0].sum() == 6
    assert row["completion_positions"].tolist() == [[2, 3, 4, 5], [2, 3, 4, 0]]  # x, y, EOS, then padding
    assert row["completion_targets"][1][:3].tolist() == [*TOK.encode("xy"), TOK.eos_id]
    assert row["completion_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    for k in ("inputs", "targets", "loss_mask"):  # the rejected completion fits: unchanged
        assert (row[k][1] == whole[k][1]).all()


def test_a_shared_prompt_row_holds_the_prompt_once_and_each_completion_after_it():
    """data.share_prompt: BOS p q | a b c (d is only a target) | x y (EOS only a target); the
    rejected completion's positions restart after the prompt and it sees the prompt, not a-d."""
    rec = {"prompt": "pq", "chosen": "abcdef", "rejected": "xy"}
    row = Encoder("preference", TOK, "simple", 8, "keep_start", max_completion_len=4, share_prompt=True)(rec)
    assert row["inputs"].tolist() == [TOK.bos_id, *TOK.encode("pqabcxy"), *[TOK.pad_id] * 4]  # 8 + 4 wide
    assert row["positions"].tolist() == [0, 1, 2, 3, 4, 5, 3, 4, 0, 0, 0, 0]
    assert row["segment_ids"].tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 0, 0, 0, 0]
    assert row["parent_ids"].tolist() == [1] * 8 + [0] * 4
    # chosen a b c d predicted at q a b c; rejected x at q, y at x, EOS at y
    assert row["completion_positions"].tolist() == [[2, 3, 4, 5], [2, 6, 7, 0]]
    assert row["completion_targets"].tolist() == [TOK.encode("abcd"), [*TOK.encode("xy"), TOK.eos_id, 0]]
    assert row["completion_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]


@pytest.mark.parametrize("record, message", [
    ({"prompt": "a", "chosen": "b"}, r"p\.jsonl:9: a preference record needs a string field 'rejected' \(missing\)"),
    ({"prompt": "a", "chosen": 1, "rejected": "c"}, r"'chosen' \(a int\)"),
    ({"prompt": [{"role": "user", "content": "a"}], "chosen": [{"role": "user", "content": "b"}],
      "rejected": "c"}, "'chosen' may hold only assistant messages"),
])
def test_preference_records_that_do_not_fit(record, message):
    with pytest.raises(DataError, match=message):
        Encoder("preference", TOK, "simple", 32, "keep_start")(dict(record, _where="p.jsonl:9"))


def test_prompt_answers_must_be_scalars():
    with pytest.raises(DataError, match=r"q\.jsonl:2: 'answer' must be a string or a number, got a list"):
        Encoder("prompt", TOK, "simple", 32, "keep_end")({"prompt": "a", "answer": [1], "_where": "q.jsonl:2"})
