"""Schema of the `data` group: source, record kind, tokenizer, shapes, pipeline."""

from dataclasses import dataclass
from typing import Any


@dataclass
class DataConfig:
    name: str = "synthetic"
    source: str = "synthetic"  # synthetic | jsonl | parquet | arrayrecord | hf_disk
    kind: str = "sft"  # text | sft | preference | prompt (schemas: stack/data/records.py)
    path: Any = None  # a file, directory (hf_disk), glob pattern, or a list of them
    eval_path: Any = None  # held-out files; else `eval_fraction` of `path` (seeded split)
    eval_fraction: float = 0.1
    # "byte" (built in), a Hugging Face tokenizer.json, or a SentencePiece .model (local paths)
    tokenizer: str = "byte"
    # simple | chatml | llama3 (stack/data/chat.py) | tokenizer: the tokenizer's own Jinja template
    chat_template: str = "simple"
    seq_len: int = 32
    batch_size: int = 32  # global batch; each process reads batch_size / process_count
    truncation: str = "keep_start"  # keep_start | keep_end | error (stack/data/encode.py)
    # preference: keep at most this many loss tokens of each completion (TRL DPOConfig max_completion_length);
    # DPO then runs the output head at those positions only. null: whole completions, head everywhere
    max_completion_len: Any = None
    # preference (DPO), with max_completion_len: one row per pair, the prompt once (stack/data/shared_prompt.py)
    share_prompt: bool = False
    # sft: false: loss on the completion / assistant turns only (TRL completion_only_loss / assistant_only_loss);
    # true: on every token of the record too (torchtune's name; TRL's default for a `messages` record)
    train_on_input: bool = False
    packing: bool = False  # first-fit packing of text/sft examples, with segment ids
    shuffle: bool = True
    skip_bad_records: bool = False  # drop records that do not fit, with a counted warning
    max_bad_fraction: float = 0.01  # ... and stop when more than this fraction is bad
    # Grain worker processes for the train split (0: threads in this process); each worker batches its
    # own records (grain mp_prefetch), so which records share a batch depends on the count
    workers: int = 0
    read_threads: int = 0  # Grain threads that read and encode records
    prefetch: int = 2  # batches a background thread prepares ahead (workers=0)
    max_operand: int = 100  # synthetic source: "a+b=" -> "c" with 0 <= a, b < max_operand
