"""Everything kernelrl prints for a person on a console, in one place.

Each `render_*` function takes a typed object (a result, a report, a search summary, an audit,
a baseline, degeneracy reports) and a rich `Console`; none computes anything. Machine-readable
output is the objects' own `to_dict` (the CLI's `--json`).

Guarantees: tables fit an 80-column console without cutting task names (long names fold).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from kernelrl.result import EvalResult, Status

if TYPE_CHECKING:
    from kernelrl.checks.audit import AuditReport
    from kernelrl.judge.baseline import Baseline
    from kernelrl.report.report import Report
    from kernelrl.search.loop import SearchSummary
    from kernelrl.tasks.degeneracy import DegeneracyReport
    from kernelrl.tasks.task import Task


def speedup_text(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def percent_text(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def render_result(result: EvalResult, console: Console) -> None:
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


def render_report(report: Report, console: Console) -> None:
    scope = f"run {report.run_id}" if report.run_id is not None else "all runs"
    n = len(report.tasks)
    head = Table(title=f"kernelrl report: {report.db_path} ({scope})", show_header=False)
    head.add_column("metric")
    head.add_column("value", justify="right")
    head.add_row("tasks (solved)", f"{n} ({report.solved})")
    head.add_row("geomean / median vs eager", f"{speedup_text(report.geomean_vs_eager)} / {speedup_text(report.median_vs_eager)}"
                 f"  over {report.solved} tasks")
    head.add_row("geomean / median vs torch.compile",
                 f"{speedup_text(report.geomean_vs_compile)} / {speedup_text(report.median_vs_compile)}  over {report.with_compile} tasks")
    for p, v in report.fast_p:
        head.add_row(f"fast_{p:g}", percent_text(v))
    head.add_row("success rate (correct / evaluated)",
                 f"{percent_text(report.success_rate)} ({report.correct}/{report.evaluated})")
    console.print(head)

    t = Table(title="best candidate per task")
    width = min(30, max((len(r.task) for r in report.tasks), default=4))
    t.add_column("task", min_width=width, overflow="fold")  # names are the point: fold, never cut
    # baseline times are in the HTML report; the console table fits 80 columns
    for col in ("cands", "correct", "vs eager", "vs compile", "best"):
        t.add_column(col, justify="right")
    for r in sorted(report.tasks, key=lambda r: -(r.speedup_vs_eager or 0.0)):
        style = None if r.speedup_vs_eager is None or r.speedup_vs_eager >= 1 else "red"
        t.add_row(r.task, str(r.candidates), f"{r.correct}/{r.evaluated}", speedup_text(r.speedup_vs_eager),
                  speedup_text(r.speedup_vs_compile),
                  "-" if r.best_candidate is None else f"#{r.best_candidate}", style=style)
    console.print(t)

    s = Table(title="candidates per status")
    s.add_column("status")
    s.add_column("candidates", justify="right")
    for status, count in report.status_counts:
        s.add_row(status, str(count))
    console.print(s)
    if report.refused_by_rule:
        f = Table(title="refused (flagged) candidates per rule")
        f.add_column("rule")
        f.add_column("candidates", justify="right")
        for rule, count in report.refused_by_rule:
            f.add_row(rule, str(count))
        console.print(f)
    else:
        console.print("no candidate was refused")


def render_summary(summary: SearchSummary, console: Console) -> None:
    table = Table(title=f"run {summary.run_id}{' (resumed)' if summary.resumed else ''}: "
                        f"stopped by {summary.stop_reason.value}")
    width = min(30, max((len(t.task) for t in summary.tasks), default=4))
    table.add_column("task", min_width=width, overflow="fold")
    for col in ("candidates", "evaluated", "correct", "best speedup"):
        table.add_column(col, justify="right")
    table.add_column("note")
    for t in summary.tasks:
        best = f"{t.best_speedup:.2f}x (#{t.best_candidate})" if t.best_speedup is not None else "-"
        table.add_row(t.task, str(t.candidates), str(t.evaluated), str(t.correct), best, t.gave_up or "")
    console.print(table)
    console.print(f"evaluations {summary.evaluations}, reused {summary.reused}, tokens "
                  f"{summary.prompt_tokens}+{summary.completion_tokens}, {summary.elapsed_s:.1f} s")


def render_audit(report: AuditReport, console: Console, *, max_flagged: int = 50) -> None:
    from kernelrl.checks.rules import RULES

    n = len(report.records)
    console.print(f"[bold]audit[/bold] {report.source}: {n} entries, policy {report.policy}, "
                  f"{'static + dynamic' if report.dynamic else 'static only'} checks")
    counts = report.status_counts()
    console.print("  " + ", ".join(f"{k}: {v}" for k, v in counts.items()))
    table = Table(title="rules that fired (entries)", show_lines=False)
    table.add_column("rule")
    table.add_column("stage")
    table.add_column("reject", justify="right")
    table.add_column("warn", justify="right")
    table.add_column("what it detects", overflow="fold")
    for rule, (rej, warn) in report.rule_counts().items():
        meta = RULES.get(rule)
        table.add_row(rule, meta.stage if meta else "?", str(rej), str(warn), meta.summary if meta else "")
    console.print(table)
    flagged = report.flagged
    if not flagged:
        console.print("no entry flagged")
        return
    ft = Table(title=f"flagged entries ({len(flagged)} of {n})")
    ft.add_column("entry")
    ft.add_column("task")
    ft.add_column("status")
    ft.add_column("rules")
    ft.add_column("first reason", overflow="fold")
    for r in flagged[:max_flagged]:
        first = r.rejecting[0] if r.rejecting else None
        reason = (f"line {first.line}: " if first and first.line else "") + (first.message if first else
                                                                              (r.result.message if r.result else ""))
        ft.add_row(r.entry.id, r.entry.task.name if r.entry.task else r.entry.task_ref, r.status,
                   ", ".join(sorted({f.rule for f in r.rejecting})), reason)
    console.print(ft)
    if len(flagged) > max_flagged:
        console.print(f"... and {len(flagged) - max_flagged} more flagged entries")


def render_baseline(b: Baseline, console: Console) -> None:
    text = f"[bold]{b.task}[/] ({b.size}, {b.device}): eager {b.eager_ms:.4f} ms"
    if b.compile_ms is not None:
        text += f", torch.compile {b.compile_ms:.4f} ms ({b.compile_speedup:.2f}x)"
    else:
        text += f", torch.compile unavailable: {b.compile_error}"
    console.print(text)


def render_tasks(tasks: Sequence[Task], console: Console, *, title: str, shapes: bool = False) -> None:
    from kernelrl.tasks.task import describe_shapes

    table = Table(title=title)
    for col in ("name", "level", "inputs (small)" if shapes else "constants"):
        table.add_column(col)
    for t in tasks:
        if shapes:
            try:
                detail = ", ".join(describe_shapes(t.instantiate("small")))
            except Exception as e:  # noqa: BLE001 - a broken task is shown, not fatal
                detail = f"[red]{type(e).__name__}: {e}[/red]"
        else:
            detail = ", ".join(f"{k}={v}" for k, v in t.constants().items())
        table.add_row(t.name, "" if t.level is None else str(t.level), detail)
    console.print(table)


def render_degeneracy(tasks: Sequence[Task], reports: Sequence[DegeneracyReport | Exception], console: Console) -> None:
    table = Table(title="degeneracy filter")
    for col in ("task", "verdict", "reasons"):
        table.add_column(col)
    for t, rep in zip(tasks, reports):
        if isinstance(rep, Exception):
            table.add_row(t.name, "[yellow]error[/yellow]", str(rep))
        else:
            table.add_row(t.name, "[red]degenerate[/red]" if rep.degenerate else "[green]ok[/green]",
                          "; ".join(rep.reasons))
    console.print(table)
