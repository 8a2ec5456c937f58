"""`python -m stack`: see stack.app. Ctrl-C outside the training loop (the loop installs its own
handler: it saves first) ends the process at once with one line and exit code 130."""

import os
import signal
import sys


def interrupted(signum: int, frame: object) -> None:
    """Exit 130 from the handler itself: a KeyboardInterrupt raised while Python runs a gc callback
    (jax has one) is swallowed as 'Exception ignored', and the run would go on."""
    print("interrupted (Ctrl-C)", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(130)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, interrupted)
    from stack.collector import frozen_imports

    with frozen_imports("stack.app"):  # the heap after imports is frozen (stack.collector)
        from stack.app import main

    main()
