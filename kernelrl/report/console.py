"""What kernelrl prints for a person on a console: verdicts, run reports, audits.

Each `render_*` function takes a typed object (a result, a report, an audit,
a baseline, degeneracy reports) and a rich `Console`; none computes anything. Machine-readable
output is the objects' own `to_dict` (the CLI's `--json`). The trainer's reports are rendered
beside them (`kernelrl.train.console`), and a search's summary with the search
(`kernelrl.search.summary.render_summary`), with this module's number formats: the report package
imports neither.

Guarantees: tables fit an 80-column console without cutting task names (long names fold).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from kernelrl.report.metrics import NOISE_LEGEND, compile_within_noise, noise_marked, slower_beyond_noise
from kernelrl.result import EvalResult, Status
from kernelrl.reward import RewardModel, within_noise
from kernelrl.tasks.splits import split_of

if TYPE_CHECKING:
    from kernelrl.checks.audit import AuditRecord, AuditReport
    from kernelrl.judge.calibration import Calibration
    from kernelrl.judge.timing.baseline import Baseline
    from kernelrl.report.report import Report
    from kernelrl.tasks.degeneracy import DegeneracyReport
    from kernelrl.tasks.task import Task


def speedup_text(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def interval_text(ci: tuple[float, float] | None) -> str:
    """A 95 % interval, both ends at the speedup's own precision ("2.03-2.20x")."""
    return "-" if ci is None else f"{ci[0]:.2f}-{ci[1]:.2f}x"


def percent_text(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def roofline_text(pct: float | None) -> str:
    """A share of the roofline, already in percent; above 100 % marked (`ROOFLINE_LEGEND` says why)."""
    if pct is None:
        return "-"
    return (f"{pct:.1f}%" if pct < 10 else f"{pct:.0f}%") + (ROOFLINE_MARK if pct > 100.0 else "")


ROOFLINE_MARK = "*"
ROOFLINE_LEGEND = ("* above 100 % of the roofline: faster than the floor counted from the task's FLOPs and bytes at "
                   "this machine's peaks. The peaks are raised to what the task's reference reaches (the reference "
                   "then sits at 100 %), so a program above it does less work than the reference's count of it "
                   "(a cheaper algorithm, or skipped work: the compute_floor_beaten warning says which was seen)")


def roofline_above(pcts: Sequence[float | None]) -> bool:
    """Whether any share shown is above 100 % (and the legend must say why)."""
    return any(p is not None and p > 100.0 for p in pcts)


def render_result(result: EvalResult, console: Console) -> None:
    colour = {Status.CORRECT: "green", Status.INCORRECT: "red", Status.FLAGGED: "magenta"}.get(result.status, "yellow")
    table = Table.grid(padding=(0, 2))
    table.add_row("status", f"[bold {colour}]{result.status.value}[/]")
    table.add_row("message", result.message)
    if result.speedup is not None:
        lo, hi = result.speedup_ci or (float("nan"), float("nan"))
        noisy = " [yellow]within noise[/]" if within_noise(result) else ""
        table.add_row("speedup", f"[bold]{result.speedup:.3f}x[/]  (95% CI {lo:.3f}-{hi:.3f}){noisy}")
    if result.noise_band is not None:
        table.add_row("A/A noise band", f"{result.noise_band[0]:.3f}-{result.noise_band[1]:.3f}x "
                                        "(identical code on this task, `kernelrl calibrate`)")
    reward = RewardModel().raw(result)
    if reward is not None:
        paid = " (paid as 1.0x: within noise)" if reward.within_noise else ""
        table.add_row("reward", f"{reward.raw:+.3f}{paid} (default mapping, before the clip)")
    for label, t in (("reference", result.ref_time), ("candidate", result.cand_time)):
        if t is not None:
            table.add_row(label, f"median {t.median_ms:.4f} ms, IQR {t.iqr_ms:.4f} ms, n={t.n}")
    if result.roofline_pct is not None:
        roof = result.environment.roofline
        known = (("memory floor", roof.memory_floor_ms), ("compute floor", roof.compute_floor_ms)) if roof else ()
        floors = ", ".join(f"{name} {v:.4f} ms" for name, v in known if v)
        ref = f", reference {result.ref_roofline_pct:.1f}%" if result.ref_roofline_pct is not None else ""
        table.add_row("roofline", f"{result.roofline_pct:.1f}% of this machine's roofline{ref} ({floors})")
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
        # what the message already says is not printed twice
        tail = "\n".join(e.strip() for e in result.errors if e.strip() and e.strip() not in result.message)
        if tail:
            console.print(tail[-3000:], markup=False, highlight=False)


def render_report(report: Report, console: Console) -> None:
    scope = f"run {report.run_id}" if report.run_id is not None else "all runs"
    n = len(report.tasks)
    head = Table(title=f"kernelrl report: {report.db_path} ({scope})", show_header=False)
    head.add_column("metric")
    head.add_column("value", justify="right")
    head.add_row("tasks (solved)", f"{n} ({report.solved})")
    head.add_row("geomean / median vs eager",
                 f"{speedup_text(report.geomean_vs_eager)} / {speedup_text(report.median_vs_eager)}"
                 f"  over {report.solved} tasks")
    head.add_row("geomean / median vs torch.compile",
                 f"{speedup_text(report.geomean_vs_compile)} / {speedup_text(report.median_vs_compile)}"
                 f"  over {report.with_compile} tasks")
    noisy = f" ({report.noisy_above_one} more above 1.0x but within noise)" if report.noisy_above_one else ""
    head.add_row("faster than eager (noise excluded, as in fast_p)", f"{report.faster} of {n} tasks{noisy}")
    for p, v in report.fast_p:
        head.add_row(f"fast_{p:g}", percent_text(v))
    head.add_row("success rate (correct / evaluated)",
                 f"{percent_text(report.success_rate)} ({report.correct}/{report.evaluated})")
    console.print(head)

    t = Table(title="best candidate per task")
    width = min(30, max((len(r.task) for r in report.tasks), default=4))
    t.add_column("task", min_width=width, overflow="fold")  # names are the point: fold, never cut
    # baseline times are in the HTML report; the console table fits 80 columns
    for col in ("cands", "correct", "vs eager", "vs compile", "roofline", "best"):
        t.add_column(col, justify="right")
    for r in sorted(report.tasks, key=lambda r: -(r.speedup_vs_eager or 0.0)):
        style = "red" if slower_beyond_noise(r.speedup_vs_eager, within_noise=r.within_noise) else None
        eager = noise_marked(speedup_text(r.speedup_vs_eager), r.within_noise)
        compiled = noise_marked(speedup_text(r.speedup_vs_compile), bool(r.speedup_vs_compile) and compile_within_noise(
            eager_within_noise=r.within_noise, compile_within_noise=r.compile_within_noise))
        t.add_row(r.task, str(r.candidates), f"{r.correct}/{r.evaluated}", eager, compiled,
                  roofline_text(r.roofline_pct), "-" if r.best_candidate is None else f"#{r.best_candidate}",
                  style=style)
    console.print(t)
    if report.tasks:
        console.print(NOISE_LEGEND, soft_wrap=True, highlight=False)
    if roofline_above([r.roofline_pct for r in report.tasks]):
        console.print(ROOFLINE_LEGEND, soft_wrap=True, highlight=False, markup=False)

    s = Table(title="candidates per status")
    render_by_turn(report, console)
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


def render_by_turn(report: Report, console: Console) -> None:
    """What each refinement turn added (multi-turn runs); nothing for single-turn runs."""
    if not report.by_turn:
        return
    table = Table(title="by refinement turn")
    for col in ("turn", "candidates", "correct", "faster than eager", "best", "raised a task's best"):
        table.add_column(col, justify="right")
    for turn in report.by_turn:
        table.add_row(str(turn.turn), str(turn.candidates), f"{turn.correct}/{turn.evaluated}", str(turn.faster),
                      speedup_text(turn.best_speedup), str(turn.raised))
    console.print(table)


def render_audit(report: AuditReport, console: Console, *, max_listed: int = 50) -> None:
    from kernelrl.checks.audit import AuditOutcome
    from kernelrl.checks.rules import RULES

    n = len(report.records)
    console.print(f"[bold]audit[/bold] {report.source}: {n} entries, policy {report.policy}, "
                  f"{'static + dynamic' if report.dynamic else 'static only'} checks")
    counts = report.verdict_counts()
    shown = [v for v in AuditOutcome if counts[v.value] or v in (AuditOutcome.OK, AuditOutcome.FLAGGED, AuditOutcome.INVALID,
                                                              AuditOutcome.NO_CODE)]
    console.print("  " + ", ".join(f"{v.value}: {counts[v.value]}" for v in shown))
    table = Table(title="rules that fired (entries; invalid entries left out)", show_lines=False)
    table.add_column("rule", overflow="fold")
    table.add_column("stage")
    table.add_column("reject", justify="right")
    table.add_column("warn", justify="right")
    table.add_column("what it detects", overflow="fold")
    for rule, (rej, warn) in report.rule_counts().items():
        meta = RULES.get(rule)
        table.add_row(rule, meta.stage if meta else "?", str(rej), str(warn), meta.summary if meta else "")
    console.print(table)
    _render_audit_entries(report.with_verdict(AuditOutcome.FLAGGED), f"flagged entries ({counts['flagged']} of {n})",
                          console, max_listed, reason=True)
    for verdict in (AuditOutcome.INCORRECT, AuditOutcome.FAILED, AuditOutcome.INVALID):
        records = report.with_verdict(verdict)
        if records:
            _render_audit_entries(records, f"{verdict.value} entries ({len(records)} of {n})", console, max_listed,
                                  reason=verdict is not AuditOutcome.INVALID)
    if report.degeneracy_checked is not None:
        if report.degenerate:
            dt = Table(title=f"degenerate tasks ({len(report.degenerate)} of {report.degeneracy_checked} "
                             "distinct references)")
            dt.add_column("task", overflow="fold")
            dt.add_column("entries", overflow="fold")
            dt.add_column("reasons", overflow="fold")
            for d in report.degenerate:
                dt.add_row(d.task, ", ".join(d.entries), "; ".join(d.reasons))
            console.print(dt)
        else:
            console.print(f"degeneracy filter: none of {report.degeneracy_checked} distinct references is degenerate")
        for task, why in report.degeneracy_errors.items():
            console.print(f"  degeneracy filter could not run {task}: {why}", markup=False, highlight=False)


def _render_audit_entries(records: Sequence[AuditRecord], title: str, console: Console, max_listed: int, *,
                          reason: bool) -> None:
    if not records:
        if title.startswith("flagged"):
            console.print("no entry flagged")
        return
    ft = Table(title=title)
    ft.add_column("entry", overflow="fold")
    ft.add_column("task", overflow="fold")
    ft.add_column("rules", overflow="fold")
    ft.add_column("first reason" if reason else "note", overflow="fold")
    for r in records[:max_listed]:
        first = r.rejecting[0] if r.rejecting else None
        if first is not None:
            text = (f"line {first.line}: " if first.line else "") + first.message
        elif r.result is not None:
            text = r.result.message
        else:
            text = "; ".join(x for x in (r.entry.note, r.note) if x) or (r.findings[0].message if r.findings else "")
        ft.add_row(r.entry.name, r.entry.task.name if r.entry.task else r.entry.task_ref,
                   ", ".join(r.rule_names()[0]), text)
    console.print(ft)
    if len(records) > max_listed:
        console.print(f"... and {len(records) - max_listed} more")


def render_baseline(b: Baseline, console: Console) -> None:
    text = f"[bold]{b.task}[/] ({b.size}, {b.device}): eager {b.eager_ms:.4f} ms"
    if b.compile_ms is not None:
        text += f", torch.compile {b.compile_ms:.4f} ms ({b.compile_speedup:.2f}x)"
    else:
        text += f", torch.compile unavailable: {b.compile_error}"
    console.print(text)


def render_tasks(tasks: Sequence[Task], console: Console, *, title: str,
                 shapes: dict[str, list[str] | str] | None = None) -> None:
    """A suite's tasks with their constants, or with the input shapes a judge read (`shapes`)."""
    table = Table(title=title)
    for col in ("name", "level", "split", "inputs (small)" if shapes is not None else "constants"):
        table.add_column(col)
    for t in tasks:
        if shapes is not None:
            got = shapes.get(t.name, "")
            detail = ", ".join(got) if isinstance(got, list) else f"[red]{got}[/red]"
        else:
            detail = ", ".join(f"{k}={v}" for k, v in t.constants().items())
        table.add_row(t.name, "" if t.level is None else str(t.level), split_of(t).value, detail)
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


def render_calibration(runs: Sequence[Calibration], console: Console, *, tolerance: float) -> None:
    task = runs[0].task if runs else "?"
    table = Table(title=f"{task}: the reference against two identical copies of itself")
    for col in ("run", "copy A", "copy B", "B / A", "rounds", "calls/sample", "stopped by", "reference"):
        table.add_column(col, justify="right")
    for i, r in enumerate(runs, 1):
        style = None if r.within(tolerance) else "red"
        table.add_row(str(i), f"{r.speedup_a:.3f}", f"{r.speedup_b:.3f}", f"{r.b_over_a:.3f}", str(r.rounds),
                      str(r.calls_per_sample), r.stopped_by, f"{r.reference_ms:.4f} ms", style=style)
    console.print(table)
    good = sum(r.within(tolerance) for r in runs)
    console.print(f"{good} of {len(runs)} runs within 1 +- {tolerance:g} for identical code")
