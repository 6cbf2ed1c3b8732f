"""`kernelrl watch`: the run page of a code database, served while a run writes it."""

from __future__ import annotations

import argparse
from pathlib import Path

from kernelrl.cli.options import UsageError
from kernelrl.cli.preflight import check_port, check_run_database


def cmd_watch(args: argparse.Namespace) -> int:
    db = Path(args.db)
    if db.exists() and not (db.is_file() and db.stat().st_size == 0):
        check_run_database(db)  # a file that is not a run database is refused, not served as a 503
    check_port(args.host, args.port)
    from kernelrl.web.live import run_standalone

    try:
        run_standalone(db, host=args.host, port=args.port, announce=lambda line: print(line, flush=True))
    except OSError as e:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from e
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register this module's commands."""
    p = sub.add_parser("watch", help="web pages of a run database, updated while the run goes (read-only)")
    p.add_argument("--db", required=True, help="the code database (it may not exist yet: the page waits for it; "
                                                "an existing file must be a run database)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; no authentication)")
    p.add_argument("--port", type=int, default=8178, help="port (default 8178; 0: any free port)")
    p.set_defaults(func=cmd_watch, runtime=False)
