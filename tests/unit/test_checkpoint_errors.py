"""A failed save becomes one paragraph naming the step, the path, the OS error and what restores."""

from types import SimpleNamespace

import pytest

from stack.checkpoint.errors import writing
from stack.errors import RunFailed

TIER = SimpleNamespace(path="/ckpt", manager=SimpleNamespace(all_steps=lambda: [7, 14]))


def failed_save(raise_error) -> str:
    with pytest.raises(RunFailed) as info, writing(TIER, 14):
        raise_error()
    return str(info.value)


def test_the_os_error_is_found_in_a_tensorstore_message():
    def tensorstore():
        raise ValueError('Error writing "d/1a2b": File too large [os_error_code=27] [source locations=...]')

    msg = failed_save(tensorstore)
    assert msg.startswith("checkpoint step 14 could not be written to /ckpt/14: File too large (errno 27).")
    assert "step 7 there still restores" in msg


def test_the_os_error_is_read_from_its_errno_when_a_spec_annotation_precedes_it():
    """The TensorStore message of a failed OCDBT write may carry the kvstore spec between the OS error
    and its code; the text before `[os_error_code` was once shown as the error ("true}']")."""
    def tensorstore():
        raise ValueError('Failed to write 46298 bytes to file 12: File too large [tensorstore_spec=\'{"driver":'
                         '"file","file_io_sync":true}\'] [os_error_code=\'27\']')

    assert "/ckpt/14: File too large (errno 27). The run stopped" in failed_save(tensorstore)


def test_the_os_error_is_found_in_the_exceptions_a_failure_was_raised_from():
    """Orbax re-raises a background save's failure wrapped; the OS error is its cause's."""
    def wrapped():
        try:
            raise OSError(27, "File too large")
        except OSError as exc:
            raise RuntimeError("async save failed\nsee above") from exc

    assert "/ckpt/14: File too large (errno 27). The run stopped" in failed_save(wrapped)


def test_without_an_os_error_the_last_line_is_shown():
    def other():
        raise RuntimeError("first line\nthe last line")

    assert "/ckpt/14: the last line. The run stopped" in failed_save(other)
