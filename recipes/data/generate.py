"""Regenerate the shipped sample data: `python recipes/data/generate.py` (deterministic).

All files hold the synthetic arithmetic task ("a+b=" -> "a+b"); eval problems never appear in
training. Half of each file's records use the plain format, half the chat format.
- sft_{train,eval}.jsonl, sft_train.parquet: {"prompt","completion"} / {"messages": [...]}
- prefs_{train,eval}.jsonl: {"prompt","chosen","rejected"}: the right sum vs a wrong one
  (off by 1-10, or the sum's digits reversed); chat records use TRL's conversational format
- prompts_{train,eval}.jsonl: {"prompt","answer"} for verifiable-reward RL
"""

import json
import os

import numpy as np

from stack.data.sources import arithmetic_problems

HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEM = {"role": "system", "content": "Add the numbers."}


def sft(problem: dict[str, str], chat: bool, rng: np.random.Generator) -> dict:
    if not chat:
        return problem
    return {"messages": [SYSTEM, {"role": "user", "content": problem["prompt"]},
                         {"role": "assistant", "content": problem["completion"]}]}


def wrong_answer(right: str, rng: np.random.Generator) -> str:
    if len(right) > 1 and right[::-1] != right and rng.random() < 0.3:
        return right[::-1]
    return str(max(0, int(right) + int(rng.choice([-1, 1])) * int(rng.integers(1, 11))) or int(right) + 1)


def preference(problem: dict[str, str], chat: bool, rng: np.random.Generator) -> dict:
    right, wrong = problem["completion"], wrong_answer(problem["completion"], rng)
    if not chat:
        return {"prompt": problem["prompt"], "chosen": right, "rejected": wrong}
    return {"prompt": [SYSTEM, {"role": "user", "content": problem["prompt"]}],
            "chosen": [{"role": "assistant", "content": right}],
            "rejected": [{"role": "assistant", "content": wrong}]}


def prompt(problem: dict[str, str], chat: bool, rng: np.random.Generator) -> dict:
    text = problem["prompt"]
    return {"prompt": [SYSTEM, {"role": "user", "content": text}] if chat else text,
            "answer": problem["completion"]}


def records(make, split: str, n: int, seed: int) -> list[dict]:
    problems = arithmetic_problems(100, split)
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
    write_jsonl("prefs_train.jsonl", records(preference, "train", 2000, seed=2))
    write_jsonl("prefs_eval.jsonl", records(preference, "eval", 200, seed=3))
    write_jsonl("prompts_train.jsonl", records(prompt, "train", 1000, seed=4))
    write_jsonl("prompts_eval.jsonl", records(prompt, "eval", 100, seed=5))
