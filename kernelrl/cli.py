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
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from kernelrl.checks.policy import PolicyName
from kernelrl.judge.device import Device
from kernelrl.tasks.task import Size


class UsageError(Exception):
    """A bad invocation: printed as one line, exit status 2."""


def _console(json_mode: bool = False) -> Console:
    # With --json, stdout carries only the JSON object; everything for people goes to stderr.
    return Console(stderr=True) if json_mode else Console()


def _with_spinner(console: Console, text: str, fn: Callable[[], Any]) -> Any:
    with console.status(text, spinner="dots"):
        return fn()


def _task_specs(values: Sequence[str] | None) -> list[str]:
    """Task specs given as several values, comma-separated values, or both."""
    return [s.strip() for v in values or () for s in v.split(",") if s.strip()]


# ---------------------------------------------------------------------------------------------
# tasks


def cmd_tasks(args: argparse.Namespace) -> int:
    from kernelrl.report.console import render_degeneracy, render_tasks
    from kernelrl.tasks.suites import load_tasks
    from kernelrl.tasks.task import TaskError

    try:
        tasks = load_tasks(args.suite)
    except TaskError as e:
        raise UsageError(str(e)) from e
    if args.check_degeneracy:
        from kernelrl.tasks.degeneracy import check_tasks

        reports = list(check_tasks(tasks, size=args.size))
        if args.json:
            print(json.dumps([{"task": t.name, "error": str(r)} if isinstance(r, Exception) else
                              {"task": t.name, "degenerate": r.degenerate, "reasons": list(r.reasons)}
                              for t, r in zip(tasks, reports)], indent=1))
        else:
            render_degeneracy(tasks, reports, _console())
        return 0
    if args.json:
        print(json.dumps([{"name": t.name, "level": t.level, "suite": t.suite,
                           "path": str(t.path) if t.path else None} for t in tasks], indent=1))
        return 0
    render_tasks(tasks, _console(), title=f"{len(tasks)} tasks in {args.suite}", shapes=args.shapes)
    return 0


# ---------------------------------------------------------------------------------------------
# eval, baseline


def _read_candidate(path_str: str) -> Any:
    from kernelrl.candidate import Candidate, extract_code

    path = Path(path_str)
    if not path.is_file():
        raise UsageError(f"no such candidate file: {path}")
    text = path.read_text(errors="replace")
    if path.suffix in (".md", ".txt", ".answer"):
        code = extract_code(text)
        if code is None:
            raise UsageError(f"{path} holds no complete fenced code block")
        text = code
    return Candidate(source=text, origin=str(path))


def _eval_config(args: argparse.Namespace) -> Any:
    from kernelrl.judge.evaluator import EvalConfig

    try:
        config = EvalConfig(device=args.device, size=args.size, timeout_s=args.timeout, policy=args.policy)
    except ValueError as e:
        raise UsageError(str(e)) from e
    _check_device(config.device)
    return config


def _load_one_task(spec: str) -> Any:
    from kernelrl.tasks.suites import load_task
    from kernelrl.tasks.task import TaskError

    try:
        return load_task(spec)
    except TaskError as e:
        raise UsageError(str(e)) from e


def _check_device(device: str) -> None:
    if device == Device.CUDA:
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available on this machine")


def cmd_eval(args: argparse.Namespace) -> int:
    from kernelrl.judge.evaluator import ReferenceFailed, evaluate
    from kernelrl.report.console import render_result

    task = _load_one_task(args.task)
    cand = _read_candidate(args.candidate)
    config = _eval_config(args)
    console = _console(args.json)
    try:
        result = _with_spinner(console, f"evaluating {Path(args.candidate).name} on {task.name} ({config.size}, "
                                        f"{config.device})", lambda: evaluate(task, cand, config))
    except ReferenceFailed as e:
        raise UsageError(f"the task's reference fails: {str(e).splitlines()[0]}") from e
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        render_result(result, console)
    return 0


def cmd_baseline(args: argparse.Namespace) -> int:
    from kernelrl.judge.baseline import measure_baseline
    from kernelrl.judge.evaluator import ReferenceFailed
    from kernelrl.report.console import render_baseline

    task = _load_one_task(args.task)
    config = _eval_config(args)
    console = _console(args.json)
    try:
        b = _with_spinner(console, f"timing {task.name} eager and under torch.compile",
                          lambda: measure_baseline(task, config, compile=not args.no_compile))
    except ReferenceFailed as e:
        raise UsageError(f"the task's reference fails: {str(e).splitlines()[0]}") from e
    if args.json:
        print(json.dumps(b.to_dict()))
    else:
        render_baseline(b, console)
    return 0


# ---------------------------------------------------------------------------------------------
# audit


def cmd_audit(args: argparse.Namespace) -> int:
    from kernelrl.checks import audit
    from kernelrl.report.console import render_audit

    path = Path(args.path)
    if not path.exists():
        raise UsageError(f"no such file or folder: {path}")
    config = _eval_config(args) if args.dynamic else None
    console = _console(args.json)
    try:
        report = audit.audit(path, policy=args.policy, run_dynamic=args.dynamic, eval_config=config,
                             task_spec=args.task, console=console)
    except audit.AuditInputError as e:
        raise UsageError(str(e)) from e
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        render_audit(report, console)
    return 0


# ---------------------------------------------------------------------------------------------
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
    overrides["tasks"] = _task_specs(args.tasks) or None
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
    _check_device(config.eval.device)
    console = _console()
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
    console = _console()
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
            _console().print(f"{n} rows written to {args.out}")
        else:
            export_jsonl(args.db, sys.stdout, only_correct=args.only_correct)
    except DatabaseError as e:
        raise UsageError(str(e)) from e
    return 0


# ---------------------------------------------------------------------------------------------


def _add_eval_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=tuple(Device), default=Device.CPU.value)
    p.add_argument("--size", choices=tuple(Size), default=Size.SMALL.value)
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="wall-clock limit for one candidate's whole evaluation (default 300)")
    p.add_argument("--policy", choices=tuple(PolicyName), default=PolicyName.OPEN.value,
                   help="strict: needs a custom kernel; open: any PyTorch-level rewrite; observe: static rules only warn")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelrl", description="Faster PyTorch programs with LLM-written kernels.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("tasks", help="list tasks of a suite, folder or KernelBench checkout")
    p.add_argument("--suite", default="builtin", help="suite name, task folder or KernelBench checkout (default builtin)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--shapes", action="store_true", help="show input shapes at the small size")
    p.add_argument("--check-degeneracy", action="store_true",
                   help="run the degeneracy filter (near-constant or input-independent outputs)")
    p.add_argument("--size", choices=tuple(Size), default=Size.SMALL.value)
    p.set_defaults(func=cmd_tasks)

    p = sub.add_parser("eval", help="judge one candidate against a task's reference")
    p.add_argument("task", help="built-in task name or a KernelBench-format .py file")
    p.add_argument("candidate", help=".py file defining ModelNew, or a .md/.txt LLM answer")
    p.add_argument("--json", action="store_true")
    _add_eval_options(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("baseline", help="time a task's reference, eager and under torch.compile")
    p.add_argument("task")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-compile", action="store_true")
    _add_eval_options(p)
    p.set_defaults(func=cmd_baseline)

    p = sub.add_parser("audit", help="run the hack checks over a folder or JSON/JSONL of generated codes")
    p.add_argument("path")
    p.add_argument("--dynamic", action="store_true", help="also evaluate each entry (slow)")
    p.add_argument("--task", default=None, help="task for a folder of candidates without task headers")
    p.add_argument("--json", action="store_true")
    _add_eval_options(p)
    p.set_defaults(func=cmd_audit)

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


if __name__ == "__main__":
    sys.exit(main())
