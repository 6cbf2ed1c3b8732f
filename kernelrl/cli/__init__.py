"""The `kernelrl` command line: thin commands over library functions.

Each command parses its flags, calls one library function and prints what it returns (through
`kernelrl.report.console`, or as JSON with `--json`).

Exit codes: 0 whenever the command did its work (an incorrect or flagged candidate is a
verdict, not a failure); 2 for a bad invocation (missing file, unknown task, bad option) with a
one-line message on stderr; 130 when interrupted. Nothing already written (databases, reports)
is removed on error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kernelrl.cli import judge, search, serve, train, watch
from kernelrl.cli.options import UsageError
from kernelrl.cli.search import OPTIMIZE_ACTIONS, OPTIMIZE_TABLES, search_config
from kernelrl.cli.serve import SERVE_TABLES, serve_config

__all__ = ["OPTIMIZE_ACTIONS", "OPTIMIZE_TABLES", "SERVE_TABLES", "build_parser", "main", "search_config",
           "serve_config"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelrl", description="Faster PyTorch programs with LLM-written kernels.")
    sub = parser.add_subparsers(dest="command", required=True)
    for commands in (judge, search, serve, train, watch):
        commands.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
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
