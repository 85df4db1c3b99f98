"""`python -m tfcli` and the `tfcli` script. A signal that comes while the command line is still being
imported ends it as one that comes later does: exit 130 on Ctrl-C, 143 on SIGTERM, and no traceback."""

import signal
import sys


def main() -> None:
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # the CLI puts its own in place
    try:
        from tfcli.cli.app import main as run_command_line  # noqa: PLC0415  after the SIGTERM handler, inside the Ctrl-C guard
    except KeyboardInterrupt:
        sys.exit(130)
    run_command_line()


if __name__ == "__main__":
    main()
