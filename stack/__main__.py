"""`python -m stack`: see stack.app (Ctrl-C while it imports also ends with one line, exit 130)."""

import sys

try:
    from stack.app import main
except KeyboardInterrupt:
    print("interrupted (Ctrl-C)", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    main()
