"""Regenerate the shipped sample data: `python recipes/data/generate.py` (deterministic).

Eval records never appear in training. Half of each file's records use the plain format,
half the chat format.
- sft_{train,eval}.jsonl, sft_train.parquet: the arithmetic task ("a+b=" -> "a+b") as
  {"prompt","completion"} / {"messages": [...]}
- prompts_{train,eval}.jsonl: the arithmetic task as {"prompt","answer"} for verifiable-reward RL,
  both drawn from the held-out problems (`arithmetic_problems` holds out the pairs whose units
  digits are equal, never seen by SFT) and disjoint from each other: RL teaches the model a kind
  of problem its SFT warm start only partly generalises to, and is measured on unseen ones
- tools_sft_train.jsonl: plain SFT records of 2-digit sums, and of 3-digit sums answered directly or,
  a third of those, with the calculator tool ("a+b=" -> "calc(a+b) = c\nc", the tool's output
  written in): the warm start of llama_grpo_tools (tool_sft)
- tools_prompts_{train,eval}.jsonl: 3-digit sums as {"prompt","answer"}, none in tools_sft_train
- prefs_{train,eval}.jsonl: the copy task ("copy xkqz=" -> "xkqz") as {"prompt","chosen",
  "rejected"}: the exact copy vs one with a letter changed; chat records use TRL's
  conversational format. (Copying is learnable by a tiny model in a few hundred steps, so
  the DPO recipe shows preference learning on CPU; ranking right vs wrong sums needs the
  model to have learned addition first, which takes it thousands of steps.)
- copy_{train,eval}.jsonl: the chosen side of each preference pair as an SFT record, the
  reward model recipe's warm start (a trunk that can copy, as RMs start from an SFT model)
- rm_{train,eval}.jsonl: the reward model's copy pairs (10,000 / 200; no prompt of prefs_eval or of
  each other): the exact copy vs one with a letter dropped or doubled. A copy-SFT trunk already
  tracks where the word ends, so a Bradley–Terry head learns this in ~50 steps; a changed letter
  (the DPO pairs' error) takes a 4-layer RM a plateau of 200-400+ steps whose length varies
  from run to run on 2 cores (0.57-0.94 held-out accuracy after 250 steps)
"""

import json
import os

import numpy as np

from stack.data.sources import arithmetic_problems

HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEM = {"role": "system", "content": "Add the numbers."}
SYSTEM_COPY = {"role": "system", "content": "Copy the word."}
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def sft(problem: dict[str, str], chat: bool, rng: np.random.Generator) -> dict:
    if not chat:
        return problem
    return {"messages": [SYSTEM, {"role": "user", "content": problem["prompt"]},
                         {"role": "assistant", "content": problem["completion"]}]}


def copy_pair(rng: np.random.Generator, error: str = "change") -> tuple[str, str, str]:
    """(prompt, right copy, wrong copy) of a random 3-6 letter word; the wrong copy has one letter
    changed (`error="change"`) or one letter dropped or doubled (`error="length"`)."""
    word = "".join(rng.choice(list(LETTERS), size=int(rng.integers(3, 7))))
    i = int(rng.integers(len(word)))
    if error == "length":
        wrong = word[:i] + word[i + 1:] if rng.integers(2) else word[:i] + word[i] + word[i:]
    else:
        wrong = word[:i] + rng.choice([c for c in LETTERS if c != word[i]]) + word[i + 1:]
    return f"copy {word}=", word, wrong


def preferences(n: int, seed: int, exclude: set[str] = frozenset(), error: str = "change") -> list[dict]:
    rng = np.random.default_rng(seed)
    out: list[dict] = []
    while len(out) < n:
        prompt, right, wrong = copy_pair(rng, error)
        if prompt in exclude:
            continue
        if len(out) % 2 == 0:
            out.append({"prompt": prompt, "chosen": right, "rejected": wrong})
        else:
            out.append({"prompt": [SYSTEM_COPY, {"role": "user", "content": prompt}],
                        "chosen": [{"role": "assistant", "content": right}],
                        "rejected": [{"role": "assistant", "content": wrong}]})
    return out


def prompts_of(pairs: list[dict]) -> set[str]:
    """The user prompts of preference records (plain or chat)."""
    return {r["prompt"] if isinstance(r["prompt"], str) else r["prompt"][1]["content"] for r in pairs}


def copy_sft(pair: dict) -> dict:
    """The chosen side of a preference pair as an SFT record (same format: plain or chat)."""
    if isinstance(pair["prompt"], str):
        return {"prompt": pair["prompt"], "completion": pair["chosen"]}
    return {"messages": pair["prompt"] + pair["chosen"]}


def three_digit_sum(rng: np.random.Generator) -> tuple[str, int]:
    a, b = (int(x) for x in rng.integers(100, 1000, size=2))
    return f"{a}+{b}=", a + b


def tool_sft(n: int, seed: int) -> list[dict]:
    """llama_grpo_tools' warm start: 2-digit sums answered directly (55 %), and 3-digit sums, which a
    tiny model cannot learn to add: answered directly (30 %), or by a calculator call and a copy of its
    output (15 %), so that sampling calls the tool on a third of 3-digit prompts and greedy not at all."""
    rng = np.random.default_rng(seed)
    problems = arithmetic_problems(100, "train")
    out = []
    for _ in range(n):
        draw = rng.random()
        if draw >= 0.45:
            out.append(problems[int(rng.integers(len(problems)))])
            continue
        prompt, total = three_digit_sum(rng)
        call = f"calc({prompt[:-1]}) = {total}\n" if draw < 0.15 else ""
        out.append({"prompt": prompt, "completion": f"{call}{total}"})
    return out


def tool_prompts(n: int, seed: int, exclude: set[str]) -> list[dict]:
    """3-digit sums as prompt records, none of `exclude`'s prompts."""
    rng = np.random.default_rng(seed)
    out: list[dict] = []
    while len(out) < n:
        prompt, total = three_digit_sum(rng)
        if prompt not in exclude:
            exclude.add(prompt)
            out.append({"prompt": prompt, "answer": str(total)})
    return out


def prompt(problem: dict[str, str], chat: bool, rng: np.random.Generator) -> dict:
    text = problem["prompt"]
    return {"prompt": [SYSTEM, {"role": "user", "content": text}] if chat else text,
            "answer": problem["completion"]}


def records(make, split: str, n: int, seed: int, exclude: set[str] = frozenset()) -> list[dict]:
    problems = [p for p in arithmetic_problems(100, split) if p["prompt"] not in exclude]
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(problems), size=min(n, len(problems)), replace=False)
    return [make(problems[int(i)], j % 2 == 1, rng) for j, i in enumerate(picks)]


def write_jsonl(name: str, rows: list[dict]) -> None:
    with open(os.path.join(HERE, name), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def write_parquet(name: str, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), os.path.join(HERE, name), row_group_size=500)


if __name__ == "__main__":
    write_jsonl("sft_train.jsonl", records(sft, "train", 4000, seed=0))
    write_jsonl("sft_eval.jsonl", records(sft, "eval", 400, seed=1))
    write_parquet("sft_train.parquet", records(lambda p, chat, rng: p, "train", 4000, seed=0))
    evals = preferences(200, seed=3)
    write_jsonl("prefs_eval.jsonl", evals)
    held_out = prompts_of(evals)
    train = preferences(2000, seed=2, exclude=held_out)
    write_jsonl("prefs_train.jsonl", train)
    write_jsonl("copy_train.jsonl", [copy_sft(p) for p in train])
    write_jsonl("copy_eval.jsonl", [copy_sft(p) for p in evals])
    rm_evals = preferences(200, seed=8, exclude=held_out, error="length")
    write_jsonl("rm_eval.jsonl", rm_evals)
    write_jsonl("rm_train.jsonl", preferences(10000, seed=7, exclude=held_out | prompts_of(rm_evals), error="length"))
    prompt_evals = records(prompt, "eval", 256, seed=5)
    write_jsonl("prompts_eval.jsonl", prompt_evals)
    asked = {r["prompt"] if isinstance(r["prompt"], str) else r["prompt"][1]["content"] for r in prompt_evals}
    write_jsonl("prompts_train.jsonl", records(prompt, "eval", 1000, seed=4, exclude=asked))
    sft_tools = tool_sft(4000, seed=10)
    write_jsonl("tools_sft_train.jsonl", sft_tools)
    seen = {r["prompt"] for r in sft_tools}
    write_jsonl("tools_prompts_eval.jsonl", tool_prompts(256, seed=11, exclude=seen))
    write_jsonl("tools_prompts_train.jsonl", tool_prompts(2000, seed=12, exclude=seen))
