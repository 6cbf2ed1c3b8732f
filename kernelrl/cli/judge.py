"""`kernelrl tasks|eval|baseline|calibrate|audit`: look at tasks and judge candidates."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kernelrl.cli.options import (
    UsageError,
    add_eval_options,
    console_for,
    eval_config,
    load_one_task,
    read_candidate,
    with_spinner,
)
from kernelrl.cli.preflight import check_suite
from kernelrl.tasks.splits import split_of
from kernelrl.tasks.task import Size


def cmd_tasks(args: argparse.Namespace) -> int:
    from kernelrl.report.console import render_degeneracy, render_tasks
    from kernelrl.tasks.task import TaskError

    tasks = check_suite(args.suite)
    if args.check_degeneracy:
        from kernelrl.judge.degeneracy import check_tasks

        reports = list(check_tasks(tasks, size=args.size))
        if args.json:
            print(json.dumps([{"task": t.name, "error": str(r)} if isinstance(r, Exception) else
                              {"task": t.name, "degenerate": r.degenerate, "reasons": list(r.reasons)}
                              for t, r in zip(tasks, reports)], indent=1))
        else:
            render_degeneracy(tasks, reports, console_for())
        return 0
    if args.json:
        print(json.dumps([{"name": t.name, "level": t.level, "suite": t.suite, "split": split_of(t).value,
                           "path": str(t.path) if t.path else None} for t in tasks], indent=1))
        return 0
    shapes = None
    if args.shapes:
        from kernelrl.judge.evaluator import EvalConfig, Evaluator

        shapes = {}
        # Task code runs in reference workers, never here: a broken task is shown, not fatal.
        with Evaluator(EvalConfig(size=args.size, roofline=False, concurrency=1)) as ev:
            for t in tasks:
                try:
                    profile = ev.profile(t)
                    shapes[t.name] = profile.inputs if profile else "no profile"
                except TaskError as e:
                    shapes[t.name] = str(e).splitlines()[0]
    render_tasks(tasks, console_for(), title=f"{len(tasks)} tasks in {args.suite}", shapes=shapes)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from kernelrl.judge.evaluator import evaluate
    from kernelrl.report.console import render_result
    from kernelrl.result import Status

    task = load_one_task(args.task)
    cand = read_candidate(args.candidate)
    config = eval_config(args)
    console = console_for(args.json)
    result = with_spinner(console, f"evaluating {Path(args.candidate).name} on {task.name} ({config.size}, "
                                    f"{config.device})", lambda: evaluate(task, cand, config))
    if result.status is Status.TASK_ERROR:
        raise UsageError(f"the task's reference fails: {result.message}")
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        render_result(result, console)
    return 0


def cmd_baseline(args: argparse.Namespace) -> int:
    from kernelrl.judge.evaluator import measure_baseline
    from kernelrl.judge.reference import ReferenceFailed
    from kernelrl.report.console import render_baseline

    task = load_one_task(args.task)
    config = eval_config(args)
    console = console_for(args.json)
    try:
        b = with_spinner(console, f"timing {task.name} eager and under torch.compile",
                          lambda: measure_baseline(task, config, compile=not args.no_compile))
    except ReferenceFailed as e:
        raise UsageError(f"the task's reference fails: {str(e).splitlines()[0]}") from e
    if args.json:
        print(json.dumps(b.to_dict()))
    else:
        render_baseline(b, console)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from kernelrl.judge.evaluator import Evaluator
    from kernelrl.judge.reference import ReferenceFailed
    from kernelrl.report.console import render_calibration

    task = load_one_task(args.task)
    config = eval_config(args)
    console = console_for(args.json)
    if args.runs < 1:
        raise UsageError(f"--runs must be at least 1, got {args.runs}")
    try:
        with Evaluator(config) as ev:
            runs = with_spinner(console, f"timing {task.name} against identical copies of itself, {args.runs} times",
                                 lambda: ev.calibrate(task, runs=args.runs), ev)
    except ReferenceFailed as e:
        raise UsageError(f"the task's reference fails: {str(e).splitlines()[0]}") from e
    if args.json:
        print(json.dumps({"task": task.name, "tolerance": args.tolerance,
                          "within": all(r.within(args.tolerance) for r in runs), "runs": [r.to_dict() for r in runs]}))
    else:
        render_calibration(runs, console, tolerance=args.tolerance)
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from kernelrl.audit import audit
    from kernelrl.checks.audit import AuditInputError
    from kernelrl.report.console import render_audit

    path = Path(args.path)
    if not path.exists():
        raise UsageError(f"no such file or folder: {path}")
    # The policy applies to the static checks too; the device matters only when entries are run.
    config = eval_config(args, check=args.dynamic)
    console = console_for(args.json)
    if args.limit is not None and args.limit < 0:
        raise UsageError("--limit must be >= 0")
    only = [s.strip() for v in args.only or () for s in v.split(",") if s.strip()]
    try:
        report = audit(path, policy=config.policy, run_dynamic=args.dynamic,
                       eval_config=config if args.dynamic else None,
                       task_spec=args.task, only=only, limit=args.limit, degeneracy=args.degeneracy,
                       console=console)
    except AuditInputError as e:
        raise UsageError(str(e)) from e
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        render_audit(report, console)
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register this module's commands."""
    p = sub.add_parser("tasks", help="list tasks of a suite, folder or KernelBench checkout")
    p.add_argument("--suite", default="builtin", help="suite name, task folder or KernelBench checkout (default builtin)")
    p.add_argument("--json", action="store_true", help="print one JSON list instead of a table")
    p.add_argument("--shapes", action="store_true", help="show input shapes at the small size")
    p.add_argument("--check-degeneracy", action="store_true",
                   help="run the degeneracy filter (near-constant or input-independent outputs)")
    p.add_argument("--size", choices=tuple(Size), default=Size.SMALL.value,
                   help="size preset for --shapes and --check-degeneracy (default small)")
    p.set_defaults(func=cmd_tasks, runtime=False)

    p = sub.add_parser("eval", help="judge one candidate against a task's reference")
    p.add_argument("task", help="built-in task name or a KernelBench-format .py file")
    p.add_argument("candidate", help=".py file defining ModelNew, or a .md/.txt LLM answer")
    p.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    add_eval_options(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("baseline", help="time a task's reference, eager and under torch.compile")
    p.add_argument("task", help="built-in task name or a KernelBench-format .py file")
    p.add_argument("--json", action="store_true", help="print the times as one JSON object")
    p.add_argument("--no-compile", action="store_true", help="time eager only (torch.compile is slow on a CPU)")
    add_eval_options(p)
    p.set_defaults(func=cmd_baseline)

    p = sub.add_parser("calibrate", help="A/A check: a task's reference timed against identical copies of itself")
    p.add_argument("task", help="built-in task name or a KernelBench-format .py file")
    p.add_argument("--runs", type=int, default=5, help="A/A runs, each a timed group of identical copies (default 5)")
    p.add_argument("--tolerance", type=float, default=0.02, help="|speedup - 1| allowed for identical code")
    p.add_argument("--json", action="store_true", help="print the runs as one JSON object")
    add_eval_options(p)
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("audit", help="run the hack checks over a folder or JSON/JSONL of generated codes")
    p.add_argument("path", help="a folder of candidates, or JSON / JSON Lines files of generated codes")
    p.add_argument("--dynamic", action="store_true", help="also evaluate each entry (slow; prints progress)")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME",
                   help="entries to audit: names or patterns such as level2/* (several values or comma-separated)")
    p.add_argument("--limit", type=int, default=None, help="audit only the first N selected entries")
    p.add_argument("--degeneracy", action="store_true",
                   help="run the degeneracy filter once per distinct reference (runs each reference; slow)")
    p.add_argument("--task", default=None, help="task for a folder of candidates without task headers")
    p.add_argument("--json", action="store_true",
                   help='print {"summary": {...counts by verdict and rule}, "entries": [{"name", "verdict", '
                        '"rules", ...}]}')
    add_eval_options(p)
    p.set_defaults(func=cmd_audit)
