"""`kernelrl optimize|report|export`: the search over a code database, and what it found."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kernelrl.checks.policy import PolicyName
from kernelrl.cli.options import (
    BUILD_TIMEOUT_HELP,
    UsageError,
    check_device,
    console_for,
    task_specs,
)
from kernelrl.judge.device import Device
from kernelrl.tasks.task import Size

# optimize / report / export

# Every flag of `optimize` and the field of `SearchConfig` it sets (dotted: nested configs).
# Flags not listed here are actions, not settings.
OPTIMIZE_FLAGS: dict[str, str] = {
    "tasks": "tasks",
    "proposer": "proposer",
    "budget": "budget",
    "db": "db_path",
    "chains": "chains",
    "resume": "resume",
    "policy": "eval.policy",
    "device": "eval.device",
    "size": "eval.size",
    "timeout": "eval.timeout_s",
    "build_timeout": "eval.build_timeout_s",
    "timing_cap": "eval.timing.max_timing_s",
    "eval_concurrency": "eval.concurrency",
    "wall_time": "wall_time_s",
    "token_budget": "token_budget",
    "templates": "template_dir",
    "base_url": "proposer_opts.base_url",
    "temperature": "proposer_opts.temperature",
    "max_tokens": "proposer_opts.max_tokens",
    "model_concurrency": "model_concurrency",
}


OPTIMIZE_ACTIONS = ("config", "report", "html")


def search_config(args: argparse.Namespace) -> Any:
    """The run's `SearchConfig`: the named config file, then the flags given on top."""
    from kernelrl.config import ConfigError, build, load_toml, with_overrides
    from kernelrl.search.loop import SearchConfig

    overrides = {field: getattr(args, dest) for dest, field in OPTIMIZE_FLAGS.items()}
    overrides["tasks"] = task_specs(args.tasks) or None
    overrides["resume"] = bool(args.resume) or None
    if args.model_concurrency is not None:
        # one limit for the loop's threads and the endpoint's requests in flight
        overrides["proposer_opts.concurrency"] = args.model_concurrency
    try:
        values = with_overrides(load_toml(args.config) if args.config else {}, overrides)
        if "db_path" not in values:
            raise UsageError("--db PATH is required (or db_path in the run config)")
        return build(SearchConfig, values)
    except ConfigError as e:
        raise UsageError(f"bad run configuration: {e}") from e


def cmd_optimize(args: argparse.Namespace) -> int:
    from kernelrl.report.console import render_summary
    from kernelrl.search.database import DatabaseError
    from kernelrl.search.loop import StopReason, run_search
    from kernelrl.search.proposers import ProposerError
    from kernelrl.tasks.task import TaskError

    config = search_config(args)
    check_device(config.eval.device)
    console = console_for()
    if not config.resume and config.db_path.exists():
        # A new run in the same database: stored results are reused, never re-evaluated.
        console.print(f"{config.db_path} exists: starting a new run in it (--resume continues the last one)")
    try:
        summary = run_search(config, console=console)
    except (TaskError, DatabaseError, ProposerError) as e:
        raise UsageError(str(e)) from e
    render_summary(summary, console)
    if summary.stop_reason is StopReason.INTERRUPTED:
        return 130
    if args.report:
        return cmd_report(argparse.Namespace(db=str(config.db_path), html=args.html, run=summary.run_id))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from kernelrl.report.console import render_report
    from kernelrl.report.html import write_html
    from kernelrl.report.report import build_report
    from kernelrl.search.database import DatabaseError

    if not Path(args.db).is_file():
        raise UsageError(f"no such database: {args.db}")
    try:
        report = build_report(args.db, run_id=args.run)
    except (DatabaseError, ValueError) as e:
        raise UsageError(str(e)) from e
    console = console_for()
    render_report(report, console)
    if args.html:
        out = write_html(report, args.html)
        console.print(f"HTML report written to {out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from kernelrl.report.export import export_jsonl
    from kernelrl.search.database import DatabaseError

    if not Path(args.db).is_file():
        raise UsageError(f"no such database: {args.db}")
    try:
        if args.out:
            n = export_jsonl(args.db, args.out, only_correct=args.only_correct)
            console_for().print(f"{n} rows written to {args.out}")
        else:
            export_jsonl(args.db, sys.stdout, only_correct=args.only_correct)
    except DatabaseError as e:
        raise UsageError(str(e)) from e
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register this module's commands."""
    p = sub.add_parser("optimize", help="search for faster programs with a proposer")
    p.add_argument("--config", default=None, help="named run config (kernelrl/configs/NAME.toml) or a .toml file")
    p.add_argument("--tasks", nargs="+", default=None, metavar="SPEC",
                   help="suites, task names, files or folders (several values, or comma-separated)")
    p.add_argument("--proposer", default=None, help="heuristic | openai:MODEL | hf:PATH | replay:PATH")
    p.add_argument("--budget", type=int, default=None, help="candidates per task")
    p.add_argument("--db", default=None, help="SQLite database of the run")
    p.add_argument("--chains", type=int, default=None)
    p.add_argument("--resume", action="store_true", help="continue the last run in --db")
    p.add_argument("--policy", choices=tuple(PolicyName), default=None)
    p.add_argument("--device", choices=tuple(Device), default=None)
    p.add_argument("--size", choices=tuple(Size), default=None)
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="per-candidate evaluation limit")
    p.add_argument("--build-timeout", type=float, default=None, metavar="SECONDS", help=BUILD_TIMEOUT_HELP)
    p.add_argument("--timing-cap", type=float, default=None, metavar="SECONDS",
                   help="per candidate: timing stops here when the +-1 %% interval is not reached")
    p.add_argument("--wall-time", type=float, default=None, metavar="SECONDS")
    p.add_argument("--token-budget", type=int, default=None)
    p.add_argument("--eval-concurrency", type=int, default=None)
    p.add_argument("--templates", default=None, help="folder of prompt templates overriding the built-in ones")
    p.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint (default: OPENAI_BASE_URL)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--max-tokens", type=int, default=None, help="per answer")
    p.add_argument("--model-concurrency", type=int, default=None, help="model calls at once")
    p.add_argument("--report", action="store_true", help="print this run's report when done")
    p.add_argument("--html", default=None, help="with --report: also write an HTML report")
    p.set_defaults(func=cmd_optimize)

    p = sub.add_parser("report", help="summarise a run database")
    p.add_argument("--db", required=True)
    p.add_argument("--html", default=None)
    p.add_argument("--run", type=int, default=None, help="one run id (default: all runs)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("export", help="write a run database as JSONL training rows")
    p.add_argument("--db", required=True)
    p.add_argument("--out", default=None)
    p.add_argument("--only-correct", action="store_true")
    p.set_defaults(func=cmd_export)
