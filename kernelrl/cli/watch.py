"""`kernelrl watch`: the run page of a code database, served while a run writes it."""

from __future__ import annotations

import argparse
from pathlib import Path

from kernelrl.cli.options import UsageError


def cmd_watch(args: argparse.Namespace) -> int:
    from kernelrl.report.watch.app import run_watch

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0-65535, got {args.port}")
    db = Path(args.db)
    if db.exists() and not db.is_file():
        raise UsageError(f"--db {db} is not a file")
    try:
        run_watch(db, host=args.host, port=args.port, announce=lambda line: print(line, flush=True))
    except OSError as e:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from e
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register this module's commands."""
    p = sub.add_parser("watch", help="web pages of a run database, updated while the run goes (read-only)")
    p.add_argument("--db", required=True, help="the code database (it may not exist yet: the page waits for it)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; no authentication)")
    p.add_argument("--port", type=int, default=8178, help="port (default 8178; 0: any free port)")
    p.set_defaults(func=cmd_watch)
