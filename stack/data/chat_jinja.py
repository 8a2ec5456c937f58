"""A tokenizer's own Jinja chat template (`data.chat_template=tokenizer`), rendered the way
transformers' `apply_chat_template` renders it: jinja2's ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loop controls, a `tojson` filter that does not HTML-escape, the
globals `raise_exception` and `strftime_now`, and the special tokens of tokenizer_config.json
(bos_token, eos_token, ...) as variables. The template is `chat_template.jinja` beside the
tokenizer, else tokenizer_config.json's `chat_template` (a string, or the entry named `default`).

Loss (TRL SFTTrainer `assistant_only_loss`, transformers `return_assistant_tokens_mask`): the
`{% generation %}...{% endgeneration %}` spans where the template has them, else each assistant
message's content and the special token that directly follows it: the eos_token, or another of
the tokenizer's special tokens (the end of turn the model emits: Qwen's <|im_end|> where eos is
<|endoftext|>, Gemma's <end_of_turn> where eos is <eos>). The rendered text
carries its own specials, so the encoder adds no BOS/EOS around it.
"""

import json
import os
import re
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from stack.errors import ConfigError, DataError

OPEN, CLOSE = "\ue000", "\ue001"  # private-use marks around a generation span while rendering
SPECIALS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
Pieces = list[tuple[str, bool]]


def _environment() -> Any:
    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}`: the body, marked as a span that carries loss."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

        def _mark(self, caller: Any) -> str:
            return OPEN + caller() + CLOSE

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    return env


def _special(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    return value.get("content") if isinstance(value, dict) else value


def _unmark(marked: str, error: str) -> tuple[str, list[tuple[int, int]]]:
    """`marked` without its OPEN/CLOSE marks, and the spans they enclosed (DataError `error` if unpaired)."""
    parts, spans, rest, pos = [], [], marked, 0
    while (a := rest.find(OPEN)) >= 0:
        b = rest.find(CLOSE, a)
        if b < 0 or OPEN in rest[a + 1:b] or CLOSE in rest[:a]:
            raise DataError(error)
        inner = rest[a + 1:b]
        parts += [rest[:a], inner]
        spans.append((pos + a, pos + a + len(inner)))
        pos, rest = pos + a + len(inner), rest[b + 1:]
    if CLOSE in rest:
        raise DataError(error)
    return "".join(parts) + rest, spans


class JinjaTemplate:
    """A compiled chat template; `render` gives (text, has_loss) pieces. Picklable (Grain workers)."""

    own_specials = True  # the rendered text holds BOS / end-of-turn tokens itself

    def __init__(self, source: str, specials: dict[str, str], where: str, ends: tuple[str, ...] = ()):
        self.source, self.specials, self.where = source, specials, where
        eos = specials.get("eos_token")
        self.ends = tuple(sorted({*ends, *([eos] if eos else [])}, key=lambda t: (t != eos, -len(t))))
        self.has_generation = re.search(r"\{%-?\s*generation\s*-?%\}", source) is not None
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(f"'data.chat_template'=tokenizer: the template in {where} does not parse "
                              f"(line {exc.lineno}: {exc.message}).") from None

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "specials": self.specials, "where": self.where, "ends": self.ends}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    def render_text(self, messages: list[dict[str, str]], generation_prompt: bool = False,
                    where: str = "record") -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and its loss spans [(start, end)) in characters."""
        if any(OPEN in m["content"] or CLOSE in m["content"] for m in messages):
            raise DataError(f"{where}: a message holds the private-use characters U+E000/U+E001, which the chat "
                            "template renderer reserves.")
        try:
            marked = self._template.render(messages=messages, add_generation_prompt=generation_prompt,
                                           tools=None, documents=None, **self.specials)
        except jinja2.TemplateError as exc:
            raise DataError(f"{where}: the chat template of {self.where} refused the messages: {exc}") from None
        text, spans = _unmark(marked, f"{where}: the {{% generation %}} blocks of {self.where} nest or do not close.")
        return text, spans if self.has_generation else self._assistant_spans(text, messages, where)

    def _assistant_spans(self, text: str, messages: list[dict[str, str]], where: str) -> list[tuple[int, int]]:
        """No generation blocks: each assistant content (found in order, as is or stripped, as templates
        often `trim` it) and the special token right after it (`ends`: eos first)."""
        spans, cursor = [], 0
        for m in messages:
            if m["role"] != "assistant":
                continue
            needle = next((c for c in (m["content"], m["content"].strip()) if text.find(c, cursor) >= 0), None)
            if not needle:
                raise DataError(f"{where}: an assistant message's content does not appear in the text the chat "
                                f"template of {self.where} rendered, so its loss cannot be placed.")
            start = text.find(needle, cursor)
            end = start + len(needle)
            end += len(next((t for t in self.ends if text.startswith(t, end)), ""))
            spans.append((start, end))
            cursor = end
        return spans

    def render(self, messages: list[dict[str, str]], generation_prompt: bool = False, where: str = "record") -> Pieces:
        text, spans = self.render_text(messages, generation_prompt, where)
        pieces, prev = [], 0
        for start, end in spans:
            pieces += [(text[prev:start], False), (text[start:end], True)]
            prev = end
        return [(t, loss) for t, loss in pieces + [(text[prev:], False)] if t]


def from_tokenizer(spec: str) -> JinjaTemplate:
    """The chat template of the tokenizer `spec` (a directory, or a file inside one)."""
    root = spec if os.path.isdir(spec) else os.path.dirname(spec) or "."
    config_path = os.path.join(root, "tokenizer_config.json")
    config = {}
    if os.path.isfile(config_path):
        with open(config_path) as f:
            config = json.load(f)
    specials = {k: _special(config[k]) for k in SPECIALS if _special(config.get(k)) is not None}
    ends = _special_tokens(root, config)
    jinja_path = os.path.join(root, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        with open(jinja_path) as f:
            return JinjaTemplate(f.read(), specials, jinja_path, ends)
    source = config.get("chat_template")
    if isinstance(source, list):  # [{"name": ..., "template": ...}, ...]
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    if not isinstance(source, str):
        raise ConfigError(f"'data.chat_template'=tokenizer: 'data.tokenizer'={spec!r} has no chat template (neither "
                          f"{jinja_path} nor a 'chat_template' in {config_path}). Use a tokenizer that ships one, "
                          "or a built-in template: simple, chatml, llama3.")
    return JinjaTemplate(source, specials, config_path, ends)


def _special_tokens(root: str, config: dict) -> tuple[str, ...]:
    """The tokenizer's special tokens: tokenizer.json's added tokens and tokenizer_config.json's
    added_tokens_decoder entries marked special."""
    added = list(config.get("added_tokens_decoder", {}).values())
    path = os.path.join(root, "tokenizer.json")
    if os.path.isfile(path):
        with open(path) as f:
            added += json.load(f).get("added_tokens", [])
    return tuple(sorted({t["content"] for t in added if t.get("special") and t.get("content")}))
