"""launcher=local relays rank 0's output without Gloo's connection line, as it comes: a progress
bar's unfinished line passes at once, a line that may still become Gloo's waits for its end; the
relay process outlives Ctrl-C and SIGTERM and ends with the rank's output."""

import os
import signal
import time

from stack.launch.relay import relay, split


def test_gloo_lines_are_dropped_and_the_rest_passes_as_it_comes(tmp_path):
    out = os.open(tmp_path / "console", os.O_WRONLY | os.O_CREAT)
    write, proc = relay(out)
    seen = lambda: (tmp_path / "console").read_bytes()  # noqa: E731
    for chunk in (b"step 0: eval/loss 5.9\n[Glo", b"o] Rank 0 is connected to 1 peer ranks.\n",
                  b"\r[####....] 10/20 loss 5.8"):
        os.write(write, chunk)
    deadline = time.monotonic() + 10
    while not seen().endswith(b"10/20 loss 5.8") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen() == b"step 0: eval/loss 5.9\n\r[####....] 10/20 loss 5.8"  # the bar before its line ends
    proc.send_signal(signal.SIGINT)  # Ctrl-C reaches the whole process group: the relay stays
    proc.send_signal(signal.SIGTERM)
    os.write(write, b"\r[########] 20/20 loss 5.1\n[Gloo] Rank 0 again\ndone: 20 steps")
    os.close(write)
    assert proc.wait(timeout=10) == 0
    os.close(out)
    assert seen() == (b"step 0: eval/loss 5.9\n\r[####....] 10/20 loss 5.8\r[########] 20/20 loss 5.1\n"
                      b"done: 20 steps")


def test_a_gloo_line_flushed_inside_another_line_is_cut_out():
    """A pipe's writer (Python, block-buffered) may flush half a line before Gloo's lands."""
    data = b"step 0: eval/loss 6.6 e[Gloo] Rank 0 is connected to 1 peer ranks.\nval/rewards 0.5\n[Glo"
    assert split(data) == (b"step 0: eval/loss 6.6 eval/rewards 0.5\n", b"[Glo")
