"""Chat templates: messages -> (text, has_loss) pieces; only assistant turns carry loss.

`data.chat_template` names one of TEMPLATES, or `tokenizer`: the tokenizer's own Jinja template
(stack.data.chat_jinja). A built-in turn renders as `header.format(role=role) + content + end`.
The assistant's content carries loss, and so does its `end` when the template's end-of-turn is
a special token (chatml, llama3), so the model learns to stop. The whole sequence is then
wrapped in the tokenizer's BOS ... EOS.
"""

from dataclasses import dataclass
from typing import Any, ClassVar

from stack.data.chat_jinja import from_tokenizer
from stack.errors import DataError

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatTemplate:
    header: str  # turn prefix, formatted with {role}
    end: str  # end of a turn
    end_has_loss: bool  # the assistant's end-of-turn is learned
    own_specials: ClassVar[bool] = False  # the encoder wraps the text in BOS ... EOS

    def render(self, messages: list[dict[str, str]], generation_prompt: bool = False,
               where: str = "record") -> list[tuple[str, bool]]:
        """(text, has_loss) pieces of checked messages; `generation_prompt` opens an assistant turn."""
        out: list[tuple[str, bool]] = []
        for m in messages:
            header = self.header.format(role=m["role"])
            if m["role"] == "assistant":
                out += [(header, False), (m["content"], True), (self.end, self.end_has_loss)]
            else:
                out.append((header + m["content"] + self.end, False))
        if generation_prompt:
            out.append((self.header.format(role="assistant"), False))
        elif out and out[-1] == (self.end, False):
            out.pop()  # a plain-text end of the last turn: the EOS ends the sequence instead
        return out


TEMPLATES = {
    "simple": ChatTemplate("{role}: ", "\n", False),
    "chatml": ChatTemplate("<|im_start|>{role}\n", "<|im_end|>\n", True),
    "llama3": ChatTemplate("<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>", True),
}


def check_messages(messages: Any, where: str, field: str) -> list[dict[str, str]]:
    """`messages` if it is a non-empty list of {role, content} with known roles, else DataError."""
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: '{field}' must be a non-empty list of {{role, content}} messages.")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise DataError(
                f"{where}: each message of '{field}' needs 'role' in {ROLES} and a string 'content', got {m!r}."
            )
    return messages


def make_template(name: str, tokenizer: str) -> Any:
    """The template `data.chat_template` names; `tokenizer`: the one of `data.tokenizer`."""
    if name != "tokenizer":
        return TEMPLATES[name]
    return from_tokenizer(tokenizer)
