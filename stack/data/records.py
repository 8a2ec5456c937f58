"""Record kinds and their schemas: a record (dict) -> (text, has_loss) pieces.

- `text`       {"text": str}: pretraining; every token carries loss.
- `sft`        {"prompt": str, "completion": str} or {"messages": [{"role", "content"}, ...]}:
               loss only on the completion / assistant turns; a conversational prompt and
               completion (message lists) learn the completion's turns only.
- `preference` {"prompt", "chosen", "rejected"}: each a string, or the prompt a message list
               and chosen / rejected assistant message lists (TRL's conversational format);
               without "prompt", the common start of chosen and rejected is the prompt (TRL's
               implicit prompt, `implicit_prompt`);
               an optional numeric `margin` (reward models: TRL RewardTrainer's column).
- `prompt`     {"prompt": str | messages, "answer": str | number (optional), ...}: for PPO/GRPO;
               chat prompts end with an open assistant turn; the other fields go to the
               reward functions (`reward_fields`).

A record that does not fit raises DataError naming its file and line (`_where`).
"""

import json
import os
from typing import Any

from stack.data.chat import check_messages
from stack.errors import DataError

Template = Any  # stack.data.chat.ChatTemplate or stack.data.chat_jinja.JinjaTemplate: .render(messages, ...)

Pieces = list[tuple[str, bool]]
KINDS = ("text", "sft", "preference", "prompt")


def _keys(record: dict[str, Any]) -> list[str]:
    return sorted(k for k in record if k != "_where")


def _string(record: dict[str, Any], field: str, where: str, kind: str) -> str:
    value = record.get(field)
    if not isinstance(value, str):
        got = "missing" if field not in record else f"a {type(value).__name__}"
        raise DataError(f"{where}: a {kind} record needs a string field '{field}' ({got}); keys: {_keys(record)}.")
    return value


def text_pieces(record: dict[str, Any], where: str) -> Pieces:
    return [(_string(record, "text", where, "text"), True)]


def sft_pieces(record: dict[str, Any], where: str, template: Template, train_on_input: bool = False) -> Pieces:
    """The pieces of an sft record; a conversation without an assistant turn is learnable only with
    `train_on_input` (every token carries loss: TRL SFTTrainer with assistant_only_loss off)."""
    if "messages" in record:
        pieces = template.render(check_messages(record["messages"], where, "messages"), where=where)
        if not train_on_input and not any(loss for _, loss in pieces):
            raise DataError(f"{where}: 'messages' has no assistant turn to learn from (with "
                            "data.train_on_input=true every token of it would be).")
        return pieces
    if "prompt" not in record and "completion" not in record:
        text = " A record of plain 'text' (every token carries loss, TRL's language-modeling format) " \
            "is read with data.kind=text." if "text" in record else ""
        raise DataError(f"{where}: an sft record needs 'prompt' and 'completion', or 'messages'; "
                        f"keys: {_keys(record)}.{text}")
    return _with_prompt(record, "completion", where, template, "sft")


def _prompt(record: dict[str, Any], where: str, template: Template, generation_prompt: bool) -> Pieces:
    value = record.get("prompt")
    if isinstance(value, list):
        return template.render(check_messages(value, where, "prompt"), generation_prompt, where)
    return [(_string(record, "prompt", where, "prompt"), False)]


def implicit_prompt(record: dict[str, Any], where: str) -> dict[str, Any]:
    """A pair without 'prompt' split at the common start of 'chosen' and 'rejected' (their common
    messages; of strings, their common characters less a trailing space), as TRL's extract_prompt
    splits an implicit-prompt preference record. A string 'prompt' beside chosen / rejected
    conversations that hold it (a user turn) is dropped first, as TRL's maybe_extract_prompt does
    (HuggingFaceH4/ultrafeedback_binarized's layout)."""
    chosen, rejected = record.get("chosen"), record.get("rejected")
    if isinstance(record.get("prompt"), str) and isinstance(chosen, list) and any(
            isinstance(m, dict) and m.get("role") != "assistant" for m in chosen):
        record = {k: v for k, v in record.items() if k != "prompt"}
    if "prompt" in record or not isinstance(chosen, (str, list)) or type(chosen) is not type(rejected):
        return record
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if isinstance(chosen, str) and n > 0 and chosen[n - 1] == " ":
        n -= 1
    if n in (len(chosen), len(rejected)) or isinstance(chosen, list) and n == 0:
        how = "one of them starts the other" if n else "they share no first message"
        raise DataError(f"{where}: a preference record without 'prompt' is split where 'chosen' and 'rejected' "
                        f"first differ (TRL's implicit prompt), but {how}; give the record a 'prompt'.")
    return {**record, "prompt": chosen[:n], "chosen": chosen[n:], "rejected": rejected[n:]}


def preference_pieces(record: dict[str, Any], where: str, template: Template) -> tuple[Pieces, Pieces]:
    """(prompt + chosen, prompt + rejected) pieces; loss marks the completions."""
    record = implicit_prompt(record, where)
    return (_with_prompt(record, "chosen", where, template, "preference"),
            _with_prompt(record, "rejected", where, template, "preference"))


def _with_prompt(record: dict[str, Any], field: str, where: str, template: Template, kind: str) -> Pieces:
    """The prompt + record[field] pieces, loss on the completion only (TRL's completion-only loss).
    A conversation (prompt messages + the completion's assistant messages) renders as one and its
    prompt's own assistant turns carry no loss (TRL's DPOTrainer learns the completion only)."""
    chat, value = isinstance(record.get("prompt"), list), record.get(field)
    if not (isinstance(value, list) or chat and isinstance(value, str)):
        return [(_string(record, "prompt", where, kind), False), (_string(record, field, where, kind), True)]
    completion = check_messages(value, where, field) if isinstance(value, list) else [
        {"role": "assistant", "content": value}]
    if any(m["role"] != "assistant" for m in completion):
        raise DataError(f"{where}: '{field}' may hold only assistant messages.")
    if not chat:
        return [(_string(record, "prompt", where, kind), False)] + template.render(completion, where=where)
    prompt = check_messages(record["prompt"], where, "prompt")
    pieces = template.render(prompt + completion, where=where)
    if not any(m["role"] == "assistant" for m in prompt):  # loss comes from assistant turns only
        return pieces
    return _after(pieces, template.render(prompt, True, where))


def _after(pieces: Pieces, prompt: Pieces) -> Pieces:
    """`pieces` without loss on the characters they share with the start of the rendered `prompt`."""
    text, start = "".join(t for t, _ in pieces), "".join(t for t, _ in prompt)
    n = len(start) if text.startswith(start) else len(os.path.commonprefix([text, start]))
    out, pos = [], 0
    for piece, loss in pieces:
        cut = min(len(piece), max(0, n - pos))
        out += [(piece[:cut], False), (piece[cut:], loss)]
        pos += len(piece)
    return [(t, loss) for t, loss in out if t]


def is_chat(record: dict[str, Any]) -> bool:
    """Whether `record` is rendered by the chat template (any of its message fields is a list)."""
    return any(isinstance(record.get(k), list) for k in ("messages", "prompt", "chosen", "rejected"))


def prompt_pieces(record: dict[str, Any], where: str, template: Template) -> tuple[Pieces, str]:
    """The prompt's pieces (an open assistant turn for chat prompts) and the reference answer."""
    answer = record.get("answer", "")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise DataError(f"{where}: 'answer' must be a string or a number, got a {type(answer).__name__}.")
    return _prompt(record, where, template, generation_prompt=True), str(answer)


def reward_fields(record: dict[str, Any]) -> str:
    """A prompt record's fields other than `answer` (and a string `prompt`), as JSON: the reward
    functions' keyword arguments (TRL's GRPOTrainer passes every dataset column but the prompt),
    and a conversational prompt's messages, which TRL passes as the prompt."""
    fields = {k: v for k, v in record.items()
              if k not in ("answer", "_where") and (k != "prompt" or isinstance(v, list))}
    return FIELDS_JSON.encode(fields) if fields else "{}"


FIELDS_JSON = json.JSONEncoder(default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v))  # numpy values too
