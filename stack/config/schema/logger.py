"""Schema of the `logger` group, a list of sinks (`logger=[console,jsonl,tensorboard,wandb]`):
each option file turns its sink on; the keys below it tune them."""

from dataclasses import dataclass, field
from typing import List, Optional

SINKS = ("console", "jsonl", "tensorboard", "wandb")  # the options, each a flag below


@dataclass
class LoggerConfig:
    console: bool = False  # progress + eval rows on stdout (stack/logging/console.py)
    jsonl: bool = False  # metrics.jsonl in the run dir
    tensorboard: bool = False  # event files in <run_dir>/tensorboard
    wandb: bool = False  # a wandb run in <run_dir>/wandb
    progress: bool = True  # console: a tqdm bar on a terminal or in a notebook, else progress lines
    progress_interval: float = 30.0  # console off a terminal: seconds between progress lines
    project: str = "stack"  # wandb
    entity: Optional[str] = None
    mode: str = "offline"  # wandb: offline | online | disabled
    init_timeout: float = 5.0  # seconds before wandb's online init gives up and falls back to offline
    tags: List[str] = field(default_factory=list)
