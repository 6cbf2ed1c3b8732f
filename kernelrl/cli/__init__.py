"""The `kernelrl` command line: thin commands over library functions.

Each command parses its flags, calls one library function and prints what it returns (through
`kernelrl.report.console`, or as JSON with `--json`).

Exit codes: 0 whenever the command did its work (an incorrect or flagged candidate is a
verdict, not a failure); 2 for a bad invocation (missing file, unknown task, bad option) with a
one-line message on stderr; 130 when interrupted. Nothing already written (databases, reports)
is removed on error.

Ctrl-C, once or twice, ends with exit 130 and never an abort: `run` (the `kernelrl` command and
`python -m kernelrl`) leaves through `leave`, which, when a call or an evaluation a second Ctrl-C
left behind is still running on another thread, flushes the output, runs the exit hooks (worker
pools closed, scratch removed) and ends the process without the interpreter's teardown, which
would destroy native state (torch's threads) under that thread and abort with "terminate called
without an active exception" (exit 134); an interrupted command always leaves that way (see
`leave`). A Ctrl-C during that last step leaves at once, still with 130. Everything a run stored
is committed before this point (`kernelrl.search.loop`).
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import NoReturn

from kernelrl.cli import judge, search, serve, train, watch
from kernelrl.cli.flags import config_for_help
from kernelrl.cli.options import UsageError
from kernelrl.cli.search import OPTIMIZE_ACTIONS, OPTIMIZE_TABLES, search_config
from kernelrl.cli.serve import SERVE_TABLES, serve_config

__all__ = ["OPTIMIZE_ACTIONS", "OPTIMIZE_TABLES", "SERVE_TABLES", "build_parser", "leave", "main", "run",
           "search_config", "serve_config"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelrl", description="Faster PyTorch programs with LLM-written kernels.")
    sub = parser.add_subparsers(dest="command", required=True)
    for commands in (judge, search, serve, train, watch):
        commands.add_parsers(sub)
    # Every command's description is its one-line help (`kernelrl CMD -h` says what it does).
    for choice in sub._choices_actions:
        command = sub.choices[choice.dest]
        if command.description is None:
            command.description = choice.help
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    with config_for_help(words):  # `CMD --config NAME -h`: the help shows that config's values
        parser = build_parser()
        args = parser.parse_args(words)
    try:
        if getattr(args, "runtime", True):
            import_runtime()
        return int(args.func(args) or 0)
    except UsageError as e:
        print(f"kernelrl: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kernelrl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # stdout closed early (`kernelrl tasks --json | head`): not an error of ours
        sys.stderr.close()
        return 0


def import_runtime() -> None:
    """torch (and numpy under it), imported with a Ctrl-C held until they are in. One landing inside
    numpy's extension start leaves it half-made, and the next import fails ("cannot load module more
    than once per process", exit 1) instead of ending with 130. Commands that need no runtime
    (`tasks`, `report`, `export`, `watch`: `set_defaults(runtime=False)`) skip it and start at once;
    `train` calls it once its stage's flags are read (so `train grpo -h` answers at once)."""
    caught: list[int] = []
    held = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum)) if held else None
    try:
        import torch  # noqa: F401
    except ImportError:
        pass  # a command that needs it says so itself
    finally:
        if held:
            signal.signal(signal.SIGINT, old)
    if caught:
        raise KeyboardInterrupt


def run() -> NoReturn:
    """The `kernelrl` command: `main` on the process's arguments, left through `leave`."""
    try:
        code = main()
    except KeyboardInterrupt:  # a Ctrl-C between the command's end and here
        print("kernelrl: interrupted", file=sys.stderr)
        code = 130
    leave(code)


def leave(code: int) -> NoReturn:
    """End the process with `code`; without the interpreter's teardown when other threads still run
    (see the module docstring)."""
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
    # An interrupted command leaves the same way: after a Ctrl-C at start the interpreter's own
    # exit was seen to end the process by SIGINT (exit -2, not 130) in 3 of 27 tries here, after
    # this message was printed (likely, not confirmed: CPython's "KeyboardInterrupt unhandled" mark,
    # set by native code the interrupt passed through and read after finalisation).
    if not others and code != 130:
        sys.exit(code)

    def now(signum: int, frame: FrameType | None) -> None:
        os._exit(130)

    signal.signal(signal.SIGINT, now)  # a Ctrl-C during the exit hooks: leave at once
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
