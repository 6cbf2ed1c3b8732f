"""The `kernelrl` command line: thin commands over library functions.

Exit codes: 0 whenever the command did its work (an incorrect or flagged candidate is a
verdict, not a failure); 2 for a bad invocation (missing file, unknown task, bad option) with a
one-line message on stderr; 130 when interrupted. Nothing already written (databases, reports)
is removed on error.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

CONFIG_DIR = Path(__file__).parent / "configs"


class UsageError(Exception):
    """A bad invocation: printed as one line, exit status 2."""


def _console(json_mode: bool = False) -> Console:
    # With --json, stdout carries only the JSON object; everything for people goes to stderr.
    return Console(stderr=True) if json_mode else Console()


# ---------------------------------------------------------------------------------------------
# tasks


def cmd_tasks(args: argparse.Namespace) -> int:
    from rich.table import Table

    from kernelrl.task import TaskError, describe_shapes, load_tasks

    try:
        tasks = load_tasks(args.suite)
    except TaskError as e:
        raise UsageError(str(e)) from e
    if args.check_degeneracy:
        return _degeneracy(tasks, args)
    if args.json:
        print(json.dumps([{"name": t.name, "level": t.level, "suite": t.suite,
                           "path": str(t.path) if t.path else None} for t in tasks], indent=1))
        return 0
    table = Table(title=f"{len(tasks)} tasks in {args.suite}")
    for col in ("name", "level", "inputs (small)" if args.shapes else "constants"):
        table.add_column(col)
    for t in tasks:
        if args.shapes:
            try:
                detail = ", ".join(describe_shapes(t.instantiate("small")))
            except Exception as e:  # noqa: BLE001 - a broken task is shown, not fatal
                detail = f"[red]{type(e).__name__}: {e}[/red]"
        else:
            detail = ", ".join(f"{k}={v}" for k, v in t.constants().items())
        table.add_row(t.name, "" if t.level is None else str(t.level), detail)
    _console().print(table)
    return 0


def _degeneracy(tasks: list[Any], args: argparse.Namespace) -> int:
    from rich.table import Table

    from kernelrl.degeneracy import check_tasks

    rows = []
    table = Table(title="degeneracy filter")
    for col in ("task", "verdict", "reasons"):
        table.add_column(col)
    for t, rep in zip(tasks, check_tasks(tasks, size=args.size)):
        if isinstance(rep, Exception):
            rows.append({"task": t.name, "error": str(rep)})
            table.add_row(t.name, "[yellow]error[/yellow]", str(rep))
            continue
        rows.append({"task": t.name, "degenerate": rep.degenerate, "reasons": list(rep.reasons)})
        table.add_row(t.name, "[red]degenerate[/red]" if rep.degenerate else "[green]ok[/green]", "; ".join(rep.reasons))
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        _console().print(table)
    return 0


# ---------------------------------------------------------------------------------------------
# eval


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
    from kernelrl.evaluator import EvalConfig

    try:
        return EvalConfig(device=args.device, size=args.size, timeout_s=args.timeout, policy=args.policy)
    except ValueError as e:
        raise UsageError(str(e)) from e


def _load_one_task(spec: str) -> Any:
    from kernelrl.task import TaskError, load_task

    try:
        return load_task(spec)
    except TaskError as e:
        raise UsageError(str(e)) from e


def _check_device(device: str) -> None:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available on this machine")


def _with_spinner(console: Console, text: str, fn: Callable[[], Any]) -> Any:
    with console.status(text, spinner="dots"):
        return fn()


def cmd_eval(args: argparse.Namespace) -> int:
    from kernelrl.evaluator import ReferenceFailed, evaluate

    task = _load_one_task(args.task)
    cand = _read_candidate(args.candidate)
    config = _eval_config(args)
    _check_device(config.device)
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


def render_result(result: Any, console: Console) -> None:
    from rich.panel import Panel
    from rich.table import Table

    from kernelrl.result import Status

    colour = {Status.CORRECT: "green", Status.INCORRECT: "red", Status.FLAGGED: "magenta"}.get(result.status, "yellow")
    table = Table.grid(padding=(0, 2))
    table.add_row("status", f"[bold {colour}]{result.status.value}[/]")
    table.add_row("message", result.message)
    if result.speedup is not None:
        lo, hi = result.speedup_ci or (float("nan"), float("nan"))
        table.add_row("speedup", f"[bold]{result.speedup:.3f}x[/]  (95% CI {lo:.3f}-{hi:.3f})")
    for label, t in (("reference", result.ref_time), ("candidate", result.cand_time)):
        if t is not None:
            table.add_row(label, f"median {t.median_ms:.4f} ms, IQR {t.iqr_ms:.4f} ms, n={t.n}")
    if result.max_abs_err is not None:
        table.add_row("max error", f"abs {result.max_abs_err:.3g}, rel {result.max_rel_err:.3g}")
    if result.build_time_s is not None:
        table.add_row("build", f"{result.build_time_s:.2f} s{' (cached)' if result.build_cached else ''}")
    if result.eval_time_s is not None:
        table.add_row("evaluation", f"{result.eval_time_s:.1f} s")
    for f in result.findings:
        table.add_row(f"[magenta]{f.severity.value}[/]", f"{f.rule}: {f.message}")
    console.print(Panel(table, title=f"{result.task}", expand=False))
    if result.status not in (Status.CORRECT,) and result.errors:
        tail = "\n".join(e.strip() for e in result.errors if e.strip())
        console.print(tail[-3000:], markup=False, highlight=False)


# ---------------------------------------------------------------------------------------------
# baseline


def cmd_baseline(args: argparse.Namespace) -> int:
    from kernelrl.baseline import measure_baseline
    from kernelrl.evaluator import ReferenceFailed

    task = _load_one_task(args.task)
    config = _eval_config(args)
    _check_device(config.device)
    console = _console(args.json)
    try:
        b = _with_spinner(console, f"timing {task.name} eager and under torch.compile",
                          lambda: measure_baseline(task, config, compile=not args.no_compile))
    except ReferenceFailed as e:
        raise UsageError(f"the task's reference fails: {str(e).splitlines()[0]}") from e
    data = {"task": b.task, "device": b.device, "size": b.size, "eager_ms": b.eager_ms, "compile_ms": b.compile_ms,
            "compile_speedup": b.compile_speedup, "compile_error": b.compile_error or None}
    if args.json:
        print(json.dumps(data))
    else:
        console.print(f"[bold]{b.task}[/] ({b.size}, {b.device}): eager {b.eager_ms:.4f} ms"
                      + (f", torch.compile {b.compile_ms:.4f} ms ({b.compile_speedup:.2f}x)" if b.compile_ms else
                         f", torch.compile unavailable: {b.compile_error}"))
    return 0


# ---------------------------------------------------------------------------------------------
# audit


def cmd_audit(args: argparse.Namespace) -> int:
    from kernelrl import audit

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
        audit.render_audit(report, console)
    return 0


# ---------------------------------------------------------------------------------------------
# optimize / report / export


def _load_run_config(name: str | None) -> dict[str, Any]:
    if name is None:
        return {}
    path = Path(name)
    if not path.is_file():
        path = CONFIG_DIR / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.toml")))
        raise UsageError(f"no run config {name!r} (a .toml file, or one of: {known})")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: {e}") from e


def cmd_optimize(args: argparse.Namespace) -> int:
    from kernelrl.search import SearchConfig, run_search
    from kernelrl.task import TaskError

    values = _load_run_config(args.config)
    overrides = {"tasks": args.tasks, "proposer": args.proposer, "budget": args.budget, "db_path": args.db,
                 "chains": args.chains, "policy": args.policy, "device": args.device, "size": args.size,
                 "wall_time_s": args.wall_time, "token_budget": args.token_budget,
                 "eval_timeout_s": args.timeout, "eval_concurrency": args.eval_concurrency}
    values.update({k: v for k, v in overrides.items() if v is not None})
    if args.templates is not None:
        values["template_dir"] = args.templates
    if args.model_concurrency is not None:
        values["model_concurrency"] = args.model_concurrency
    # Endpoint options go to the proposer; the API key only ever comes from OPENAI_API_KEY.
    opts = dict(values.get("proposer_opts") or {})
    for key in ("base_url", "temperature", "max_tokens"):
        if getattr(args, key) is not None:
            opts[key] = getattr(args, key)
    if args.model_concurrency is not None:
        opts["concurrency"] = args.model_concurrency
    if opts:
        values["proposer_opts"] = opts
    if isinstance(values.get("tasks"), str):
        values["tasks"] = tuple(s for s in values["tasks"].split(",") if s)
    values["resume"] = bool(args.resume)
    if "db_path" not in values:
        raise UsageError("--db PATH is required (or db_path in the run config)")
    if not args.resume and Path(values["db_path"]).exists():
        # A new run in the same database: stored results are reused, never re-evaluated.
        _console().print(f"{values['db_path']} exists: starting a new run in it (--resume continues the last one)")
    if values.get("device") == "cuda":
        _check_device("cuda")
    try:
        config = SearchConfig(**values)
    except (TypeError, ValueError) as e:
        raise UsageError(f"bad run configuration: {e}") from e
    from kernelrl.database import DatabaseError
    from kernelrl.proposer import ProposerError
    from kernelrl.search import StopReason

    try:
        summary = run_search(config, console=_console())
    except (TaskError, DatabaseError, ProposerError) as e:
        raise UsageError(str(e)) from e
    if summary.stop_reason is StopReason.INTERRUPTED:
        return 130
    if args.report:
        return cmd_report(argparse.Namespace(db=str(config.db_path), html=args.html, run=summary.run_id))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from kernelrl.report import build_report, render_report, write_html

    if not Path(args.db).is_file():
        raise UsageError(f"no such database: {args.db}")
    from kernelrl.database import DatabaseError

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
    from kernelrl.export import export_jsonl

    if not Path(args.db).is_file():
        raise UsageError(f"no such database: {args.db}")
    from kernelrl.database import DatabaseError

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
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--size", choices=("small", "full"), default="small")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="wall-clock limit for one candidate's whole evaluation (default 300)")
    p.add_argument("--policy", choices=_policy_names(), default="open",
                   help="strict: needs a custom kernel; open: any PyTorch-level rewrite; observe: static rules only warn")


def _policy_names() -> tuple[str, ...]:
    from kernelrl.policy import POLICY_NAMES

    return tuple(POLICY_NAMES)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelrl", description="Faster PyTorch programs with LLM-written kernels.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("tasks", help="list tasks of a suite, folder or KernelBench checkout")
    p.add_argument("--suite", default="builtin", help="suite name, task folder or KernelBench checkout (default builtin)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--shapes", action="store_true", help="show input shapes at the small size")
    p.add_argument("--check-degeneracy", action="store_true",
                   help="run the degeneracy filter (near-constant or input-independent outputs)")
    p.add_argument("--size", choices=("small", "full"), default="small")
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
    p.add_argument("--tasks", default=None, help="suites, task names, files or folders, comma-separated")
    p.add_argument("--proposer", default=None, help="heuristic | openai:MODEL | hf:PATH | replay:PATH")
    p.add_argument("--budget", type=int, default=None, help="candidates per task")
    p.add_argument("--db", default=None, help="SQLite database of the run")
    p.add_argument("--chains", type=int, default=None)
    p.add_argument("--resume", action="store_true", help="continue the last run in --db")
    p.add_argument("--policy", choices=_policy_names(), default=None)
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--size", choices=("small", "full"), default=None)
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="per-candidate evaluation limit")
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
