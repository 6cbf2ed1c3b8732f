"""`kernelrl optimize|report|export`: the search over a code database, and what it found."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING

from kernelrl.cli.flags import FlagTable, add_flags, given_values, user_words
from kernelrl.cli.options import EVAL_FLAGS, UsageError, check_device, console_for
from kernelrl.cli.preflight import (
    check_files,
    check_new_database,
    check_proposer,
    check_run_database,
    check_tasks,
    check_watch,
    check_writable_parent,
)
from kernelrl.config import ConfigError, build
from kernelrl.episodes.episode import nest_episode_keys
from kernelrl.proposers.spec import inline_options
from kernelrl.search.config import SearchConfig

if TYPE_CHECKING:
    from kernelrl.tasks.task import Task

# optimize / report / export

# `optimize`'s flags: every field of SearchConfig (`kernelrl.cli.flags`), the evaluator's under the
# same names as on every judging command.
SEARCH_FLAGS = FlagTable(
    config=SearchConfig,
    names={"db_path": "--db", "template_dir": "--templates", "wall_time_s": "--wall-time",
           "batch_wait_s": "--batch-wait", "episode.turns": "--turns", "episode.history_tokens": "--history-tokens"},
    inline={"proposer_opts": "--proposer"},
    # What the command line adds to the fields' own comments (the help of every other flag).
    helps={
        "tasks": "suites, task names, files or folders (several values, or comma-separated)",
        "proposer": "heuristic | openai:MODEL | hf:PATH | replay:PATH, optionally with its options "
                    "\"openai:M base_url=URL api_key_env=VAR temperature=0.7\"",
        "episode.turns": "each chain answers in episodes of this many turns, every turn shown its earlier answers "
                         "and their verdicts; 1: every prompt fresh",
        "episode.history_tokens": "with --turns: the most the earlier turns may take of a prompt, in characters / 4",
        "episode.gamma": "the discount of later turns' rewards in a turn's return (the search pays no returns: "
                         "kept so that [episode] reads the same in every config)",
    },
    skip=frozenset({"eval"}))
OPTIMIZE_TABLES = (SEARCH_FLAGS, dataclasses.replace(EVAL_FLAGS, prefix="eval."))
OPTIMIZE_ACTIONS = ("config", "report", "html")


def search_config(args: argparse.Namespace) -> SearchConfig:
    """The run's `SearchConfig`: the named config file, then the flags given on top."""
    try:
        values = given_values(args, *OPTIMIZE_TABLES, legacy=nest_episode_keys)
        try:
            inline_options(values)
        except ValueError as e:
            raise UsageError(f"--proposer {values.get('proposer')}: {e}") from e
        if "db_path" not in values:
            raise UsageError("--db PATH is required (or db_path in the run config)")
        return build(SearchConfig, values)
    except ConfigError as e:
        raise UsageError(user_words(str(e), *OPTIMIZE_TABLES)) from e


def preflight(config: SearchConfig, args: argparse.Namespace) -> list[Task]:
    """Every check `optimize` can make before it starts a worker or a model: the database (and
    `--resume`), the proposer spec, the tasks, the templates folder, the run page's port and the
    HTML file; its tasks."""
    check_new_database(config.db_path, resume=config.resume)
    opts = dict(config.proposer_opts)
    check_proposer(config.proposer, {**opts, "policy": config.eval.policy, "device": config.eval.device})
    tasks = check_tasks(config.tasks)
    check_files([("--templates", config.template_dir)], folder=True)
    check_watch(config.watch)
    if getattr(args, "html", None):
        check_writable_parent(args.html, flag="--html")
    return tasks


def cmd_optimize(args: argparse.Namespace) -> int:
    from kernelrl.optimize import optimize
    from kernelrl.proposers import ProposerError
    from kernelrl.search.summary import StopReason, render_summary
    from kernelrl.store.schema import DatabaseError
    from kernelrl.tasks.task import TaskError

    config = search_config(args)
    check_device(config.eval.device)
    tasks = preflight(config, args)
    console = console_for()
    if not config.resume and config.db_path.exists():
        # A new run in the same database: stored results are reused, never re-evaluated.
        console.print(f"{config.db_path} exists: starting a new run in it (--resume continues the last one)")
    try:
        summary = optimize(config, tasks=tasks, console=console)
    except (TaskError, DatabaseError, ProposerError) as e:
        raise UsageError(str(e)) from e
    render_summary(summary, console)
    if summary.stop_reason is StopReason.INTERRUPTED:
        return 130
    if args.report:
        return cmd_report(argparse.Namespace(db=str(config.db_path), html=args.html, run=summary.run_id))
    if config.episode.turns > 1:
        from kernelrl.report.console import render_by_turn
        from kernelrl.report.report import build_report

        render_by_turn(build_report(config.db_path, run_id=summary.run_id), console)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from kernelrl.report.console import render_report
    from kernelrl.report.html import write_html
    from kernelrl.report.report import build_report
    from kernelrl.store.schema import DatabaseError

    check_run_database(args.db)
    if args.html:
        check_writable_parent(args.html, flag="--html")
    try:
        report = build_report(args.db, run_id=args.run)
    except (DatabaseError, ValueError) as e:
        raise UsageError(str(e)) from e
    console = console_for()
    render_report(report, console)
    if args.html:
        out = write_html(report, args.html)
        # the file holds the run's tasks and programs' verdicts: its owner's alone unless shared on purpose
        console.print(f"HTML report written to {out} (readable by you only, mode 0600: `chmod a+r {out}` "
                      "to share it)", soft_wrap=True)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from kernelrl.report.export import export_jsonl
    from kernelrl.store.schema import DatabaseError

    check_run_database(args.db)
    if args.out:
        check_writable_parent(args.out, flag="--out")
    try:
        if args.out:
            n = export_jsonl(args.db, args.out, only_correct=args.only_correct)
            console_for().print(f"{n} rows written to {args.out}")
        else:
            export_jsonl(args.db, sys.stdout, only_correct=args.only_correct)
    except DatabaseError as e:
        raise UsageError(str(e)) from e
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register this module's commands."""
    p = sub.add_parser("optimize", help="search for faster programs with a proposer; every candidate is judged "
                                        "and stored in a run database (resumable)")
    p.add_argument("--config", default=None, help="named run config (kernelrl/configs/NAME.toml) or a .toml file")
    add_flags(p, *OPTIMIZE_TABLES)
    p.add_argument("--report", action="store_true", help="print this run's report when done")
    p.add_argument("--html", default=None, help="with --report: also write an HTML report")
    p.set_defaults(func=cmd_optimize)

    p = sub.add_parser("report", help="summarise a run database: per task best speedups and intervals, fast_p, "
                                      "geomean and median against eager and torch.compile")
    p.add_argument("--db", required=True, help="the run database (`kernelrl optimize --db`)")
    p.add_argument("--html", default=None, metavar="FILE", help="also write a self-contained HTML report with plots")
    p.add_argument("--run", type=int, default=None, help="one run id (default: all runs)")
    p.set_defaults(func=cmd_report, runtime=False)

    p = sub.add_parser("export", help="write a run database as JSONL training rows (prompt, answer, code, verdict)")
    p.add_argument("--db", required=True, help="the run database (`kernelrl optimize --db`)")
    p.add_argument("--out", default=None, metavar="FILE.jsonl", help="where to write the rows (default: stdout)")
    p.add_argument("--only-correct", action="store_true", help="only candidates judged correct")
    p.set_defaults(func=cmd_export, runtime=False)
