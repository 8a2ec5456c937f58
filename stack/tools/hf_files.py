"""The files of a Hugging Face export beside the weights, as transformers writes them for a model
with its tokenizer: `generation_config.json` (bos, every eos, pad), `chat_template.jinja` (the
run's built-in `data.chat_template` as Jinja; a tokenizer's own template travels in its
tokenizer_config.json), and for the byte tokenizer a `tokenizer.json` that
`AutoTokenizer.from_pretrained` loads with the same ids (byte b -> b + 3, pad 0, bos 1, eos 2).
"""

import json
import os

from stack.data.chat import TEMPLATES
from stack.data.tokenizers import ByteTokenizer


def generation_config(bos: int, eos: list[int], pad: int) -> dict:
    """generation_config.json: the ids generation starts, stops (every one of `eos`) and pads with."""
    return {"bos_token_id": bos, "eos_token_id": eos[0] if len(eos) == 1 else eos, "pad_token_id": pad}


def chat_jinja(name: str) -> str:
    """The built-in chat template `name` (stack.data.chat.TEMPLATES) as the Jinja HF's
    apply_chat_template renders: BOS, each turn as header + content + end, and with
    add_generation_prompt an open assistant turn (what GRPO prompts and `generate --chat` encode)."""
    template = TEMPLATES[name]
    before, after = (json.dumps(part) for part in template.header.split("{role}"))
    end = json.dumps(template.end)
    return ("{{ bos_token }}{% for message in messages %}"
            f"{{{{ {before} + message['role'] + {after} + message['content'] + {end} }}}}"
            "{% endfor %}{% if add_generation_prompt %}"
            f"{{{{ {before} + 'assistant' + {after} }}}}"
            "{% endif %}")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which the tokenizers ByteLevel pre-tokenizer uses."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def write_byte_tokenizer(out: str, max_length: int) -> None:
    """tokenizer.json and tokenizer_config.json of the byte tokenizer: a ByteLevel BPE without merges
    (one token per byte), its specials, and BOS first as stack's encoder puts it."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors  # export only

    byte = ByteTokenizer()
    names = {byte.pad_id: "<pad>", byte.bos_id: "<s>", byte.eos_id: "</s>"}
    vocab = {**{name: i for i, name in names.items()}, **{c: b + 3 for b, c in _bytes_to_unicode().items()}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(names[i], special=True) for i in sorted(names)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", byte.bos_id)])
    tok.save(os.path.join(out, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "pad_token": "<pad>", "model_max_length": max_length}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
