"""Console progress (TTY only) and metrics.jsonl."""

import io

from stack.logging.sinks import ConsoleSink, JsonlSink
from tests.helpers import read_metrics


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_tty_and_quiet_otherwise():
    rows = [(10, {"train/loss": 2.5, "perf/tokens_per_sec": 1000.0}), (20, {"train/loss": 2.0, "eval/loss": 2.2})]
    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        sink = ConsoleSink(total_steps=20, stream=stream)
        for step, m in rows:
            sink.log(step, m)
        sink.close()
    assert "\r[############............] 10/20 loss 2.5000 | 1,000 tok/s" in tty.getvalue()
    assert tty.getvalue().endswith("step 20: eval/loss 2.2000\n")
    assert pipe.getvalue() == "step 20: eval/loss 2.2000\n"  # no bar, no carriage returns


def test_jsonl_one_object_per_logged_step(tmp_path):
    sink = JsonlSink(str(tmp_path))
    sink.log(0, {"eval/loss": 3.0})
    sink.log(5, {"train/loss": float("nan")})
    sink.close()
    rows = read_metrics(tmp_path)
    assert rows == [{"step": 0, "eval/loss": 3.0}, {"step": 5, "train/loss": "nan"}]
