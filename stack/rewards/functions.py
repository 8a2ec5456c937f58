"""Rule reward functions: plain functions of (prompts, completions, **record columns) -> one
float (or None: no reward for that sample) per completion, called with keywords as TRL's
GRPOTrainer calls them (stack.rewards.runner). A completion is text, or of a conversational
prompt TRL's `[{"role": "assistant", "content": text}]` (`_text` reads either).

`accuracy` compares the completion's final number (or, for non-numeric answers, its last
non-empty line) with the record's `answer`: the text after its last "####" when it has one
(GSM8K's convention, as in TRL's and Tunix's GRPO examples: "... = 72\n#### 72"); numbers
may carry thousands separators ("1,000" is 1000). `digits` gives partial credit for a numeric
answer: the fraction of digit places (aligned from the right) where the completion's final
integer agrees with it (1.0 when it is right); `format` checks `reward.format_pattern`
(a regex matched against the whole completion); `length` is a penalty in [-1, 0] that
grows with the completion's length in characters up to `reward.max_length`.
"""

import re
from typing import Any

NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")


def _reference(answer: Any) -> str:
    """The record's answer (a GSM8K solution's: the text after its last '####'), a number without
    its thousands separators."""
    text = "" if answer is None else str(answer)
    text = text.rsplit("####", 1)[1].strip() if "####" in text else text
    return text.replace(",", "") if NUMBER.fullmatch(text.strip()) else text


def _final_answer(text: str) -> str | None:
    """The last number in `text` (without thousands separators), else its last non-empty line."""
    numbers = NUMBER.findall(text)
    if numbers:
        return numbers[-1].replace(",", "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _text(completion: str | list[dict]) -> str:
    """A completion's text: itself, or a conversational completion's last message's content."""
    return completion[-1]["content"] if isinstance(completion, list) else completion


def final_answer(completion: str | list[dict]) -> str | None:
    """The answer `accuracy` reads from a completion (text or conversational): its final number,
    else its last non-empty line; None when it is empty. Sampled evaluation votes on it (maj@k)."""
    return _final_answer(_text(completion))


def _same(got: str | None, want: str) -> bool:
    if got is None:
        return False
    try:
        return float(got) == float(want)
    except ValueError:
        return got.strip() == want.strip()


def accuracy(prompts: list[str], completions: list[str], answer: list[str] | None = None,
             **record: Any) -> list[float | None]:
    """1.0 when the completion's final answer equals the record's `answer`, else 0.0 (None: no answer)."""
    if answer is None:
        return [None] * len(completions)
    wants = [_reference(want) for want in answer]
    return [None if want == "" else float(_same(final_answer(c), want))
            for c, want in zip(completions, wants, strict=True)]


def digits(prompts: list[str], completions: list[str], answer: list[str] | None = None,
           **record: Any) -> list[float | None]:
    """Digit places (from the right) where the completion's final integer matches `answer`, over
    the longer of the two (None: no numeric answer); no number in the completion scores 0."""
    out: list[float | None] = []
    for c, want in zip(completions, answer or [None] * len(completions), strict=True):
        want = _reference(want)
        if not want.lstrip("-").isdigit():
            out.append(None)
            continue
        got = final_answer(c) or ""
        got = got if got.lstrip("-").isdigit() else ""
        width = max(len(got), len(want))
        same = sum(a == b for a, b in zip(got.rjust(width), want.rjust(width), strict=True))
        out.append(same / width if got else 0.0)
    return out


def format_match(prompts: list[str], completions: list[str], pattern: str = r"\s*-?\d+\s*",
                 **record: Any) -> list[float]:
    """1.0 when the whole completion matches `pattern` (reward.format_pattern), else 0.0."""
    compiled = re.compile(pattern, re.DOTALL)
    return [float(compiled.fullmatch(_text(c)) is not None) for c in completions]


def length_penalty(prompts: list[str], completions: list[str], max_length: int = 64, **record: Any) -> list[float]:
    """-min(1, len(completion) / max_length): shorter completions score higher."""
    return [-min(1.0, len(_text(c)) / max_length) for c in completions]


RULES = {"accuracy": accuracy, "digits": digits, "format": format_match, "length": length_penalty}
