"""`python -m kernelrl ...` and the `kernelrl` command (`run`).

Light on purpose: a Ctrl-C while the command's modules are still importing ends with exit 130 and
one line, like one at any later moment (`kernelrl.cli.leave`); torch is imported later, by the
command that needs it, inside `kernelrl.cli.main`, which answers a Ctrl-C the same way.
"""

import os
import signal
import sys


def run() -> None:
    try:
        from kernelrl.cli import run as command
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("kernelrl: interrupted", file=sys.stderr)
        sys.stderr.flush()
        os._exit(130)  # not sys.exit: see kernelrl.cli.leave (nothing has started that needs closing)
    command()


if __name__ == "__main__":
    run()
