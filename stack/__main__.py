"""`python -m stack` and the `stack` console script: see stack.cli.app. Ctrl-C outside the training
loop (the loop installs its own handler: it saves first) ends the process at once with one line and
exit code 130."""

import signal

from stack.hardware.gc_freeze import frozen_imports
from stack.launch.children import interrupted


def main() -> None:
    """The entry point (pyproject's `stack` script and `python -m stack`)."""
    signal.signal(signal.SIGINT, interrupted)
    with frozen_imports("stack.cli.app"):  # the heap after imports is frozen (stack.hardware.gc_freeze)
        from stack.cli.app import main as app_main  # imported inside the freeze, after the Ctrl-C handler

    app_main()


if __name__ == "__main__":
    main()
