"""Weights & Biases sink: one independent wandb run per instance, offline by default."""

from __future__ import annotations

import os
import secrets
import string
import time
import warnings
from typing import Any

import wandb

from stack.logging.wandb_reader import is_finished

_FLUSH_TIMEOUT_S = 30.0


class WandbSink:
    """Logs metrics to its own wandb run.

    `cfg` provides `project`, `entity`, `mode` ("offline" | "online" | "disabled"),
    `init_timeout` (seconds) and `tags` (see `stack.config.schema.logger.LoggerConfig`).
    If an online init fails (timeout, auth, network), a one-line warning is issued and
    the run is started offline with the same id; upload it later with `wandb sync`.
    Online needs credentials (WANDB_API_KEY or `wandb login`): without them, wandb
    prompts on an interactive terminal, and `init_timeout` does not bound that prompt.
    `run_id` is the wandb run id (pass it back to resume); `run_dir` is the folder with
    the run's files and `run-<id>.wandb` log (None when disabled). In a sweep, `group` is the
    sweep, `name` the job's overrides, `job_type` the algorithm, `tags` recipe and hardware.
    """

    def __init__(self, cfg: Any, run_dir: str, config: dict, group: str | None = None, run_id: str | None = None,
                 name: str | None = None, job_type: str | None = None, tags: tuple[str, ...] = ()) -> None:
        init_kwargs = dict(
            project=cfg.project,
            entity=cfg.entity,
            dir=run_dir,
            config=config,
            group=group,
            # Chosen here so that an offline fallback keeps the id of the failed online run.
            id=run_id or _new_run_id(),
            resume="allow" if run_id else None,
            name=name,
            job_type=job_type,
            tags=list(dict.fromkeys([*cfg.tags, *tags])),
            settings=wandb.Settings(
                init_timeout=float(cfg.init_timeout),
                reinit="create_new",  # the default would return a still-active earlier run
                console="off",
                save_code=False,
                silent=True,
            ),
        )
        try:
            self._run = wandb.init(mode=cfg.mode, **init_kwargs)
        except Exception as exc:
            if cfg.mode != "online":
                raise
            reason = (str(exc).strip().splitlines() or [""])[0]
            # The failed online stream keeps holding the run id in the wandb-core service
            # and an offline init with that id would hang: restart the service (this also
            # finishes any other wandb run still active in this process).
            wandb.teardown()
            self._run = wandb.init(mode="offline", **init_kwargs)
            warnings.warn(
                f"wandb online init failed within logger.init_timeout={cfg.init_timeout}s ({type(exc).__name__}: "
                f"{reason}); falling back to offline run {init_kwargs['id']}: upload it later with "
                f"`wandb sync {os.path.dirname(self._run.settings.sync_file)}`",
                RuntimeWarning,
                stacklevel=2,
            )
        self.run_id: str = self._run.id
        self.run_dir: str | None = None if self._run.disabled else os.path.dirname(self._run.settings.sync_file)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Logs `metrics` at `step`."""
        self._run.log(metrics, step=step)

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        """Logs one wandb Table (e.g. a sweep's summary) under `key`."""
        self._run.log({key: wandb.Table(columns=columns, data=rows)})

    def rewind(self, step: int) -> None:
        """Nothing to drop: wandb ignores history rows at steps it already has (resume="allow")."""

    def close(self, summary: dict[str, float] | None = None) -> None:
        """Writes `summary` into the run summary and finishes the run.

        Offline, also waits until the run's log is on disk (wandb-core writes it out just
        after `finish()` returns), then says where it is and the `wandb sync` command.
        """
        if summary:
            self._run.summary.update(summary)
        self._run.finish()
        if not self._run.offline:
            return
        deadline = time.monotonic() + _FLUSH_TIMEOUT_S
        while not is_finished(self._run.settings.sync_file):
            if time.monotonic() > deadline:
                warnings.warn(f"wandb run {self.run_id} not flushed after {_FLUSH_TIMEOUT_S:.0f} s", RuntimeWarning)
                return
            time.sleep(0.005)
        print(f"wandb: offline run {self.run_id} in {self.run_dir}; upload it with: wandb sync {self.run_dir}",
              flush=True)


def _new_run_id() -> str:
    """A random 8-character base-36 id, like wandb's own."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
