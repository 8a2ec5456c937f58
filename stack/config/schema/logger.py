"""Schema of the `logger` group: console progress, metrics.jsonl, wandb."""

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class LoggerConfig:
    name: str = "console"
    progress: bool = True  # progress bar on a TTY (always quiet otherwise)
    jsonl: bool = True  # metrics.jsonl in the run dir
    wandb: bool = False
    project: str = "stack"
    entity: Optional[str] = None
    mode: str = "offline"  # offline | online | disabled
    init_timeout: float = 5.0  # seconds before online init gives up and falls back to offline
    tags: List[str] = field(default_factory=list)
