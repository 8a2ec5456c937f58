"""TensorBoard sink: scalar summaries in event files under `<run_dir>/tensorboard`, written with the
`tensorboard` package's own writer and protos (no TensorFlow), as torch's SummaryWriter does."""

import os
import time

from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter


class TensorBoardSink:
    """One scalar per metric per logged step; a resumed run first writes a SessionLog START at the
    step it goes on from, so TensorBoard drops what a killed run logged after its checkpoint."""

    def __init__(self, run_dir: str):
        self.dir = os.path.join(run_dir, "tensorboard")
        self._writer = EventFileWriter(self.dir)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in metrics.items()]
        self._writer.add_event(Event(step=step, wall_time=time.time(), summary=Summary(value=values)))

    def rewind(self, step: int) -> None:
        """TensorBoard's purge: events at steps >= a START session log's step are orphaned."""
        start = SessionLog(status=SessionLog.START)
        self._writer.add_event(Event(step=step + 1, wall_time=time.time(), session_log=start))

    def close(self, summary: dict[str, float] | None = None) -> None:
        self._writer.close()
        print(f"tensorboard: event files in {self.dir}; view them with: tensorboard --logdir {self.dir}", flush=True)
