"""What the trainer prints for a person: a stage's report, the SFT set, bench tables.

The trainer's reports are its own types (`recipe.StageReport`, `collect.CollectSummary`,
`bench.BenchReport`, `bench_turns.TurnBenchReport`), so their console rendering lives here, beside
them, and `kernelrl.report` never imports the trainer: the trainer uses the report's metrics and
number formats, not the other way round. Like `kernelrl.report.console`, nothing here computes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from kernelrl.report.console import percent_text, speedup_text

if TYPE_CHECKING:
    from kernelrl.train.bench import BenchReport
    from kernelrl.train.bench_turns import TurnBenchReport
    from kernelrl.train.collect import CollectSummary
    from kernelrl.train.explain import Explained
    from kernelrl.train.recipe import StageReport


def render_stage_report(report: StageReport, console: Console) -> None:
    console.print(f"[bold]{report.stage.value}[/bold] done in {report.seconds:.1f} s: started from "
                  f"{report.init.source} ({report.init.reason}); final model {report.final_dir}", soft_wrap=True)
    if report.outcome is not None:
        o = report.outcome
        loss = "-" if o.train_loss is None else f"{o.train_loss:.4g}"
        console.print(f"  {o.steps} optimizer steps, train loss {loss}; trainable parameter norm "
                      f"{o.norm_before:.6g} -> {o.norm_after:.6g} "
                      f"({'changed' if o.parameters_changed else '[red]unchanged[/red]'})", highlight=False,
                      soft_wrap=True)
    if report.rows:
        console.print(f"  trained on {report.rows} rows")
    if report.rounds:
        table = Table(title="rejection-sampling rounds")
        for col in ("round", "sampled", "correct", "rows trained", "verdicts", "model after"):
            table.add_column(col, overflow="fold")
        for r in report.rounds:
            verdicts = ", ".join(f"{n} {s}" for s, n in sorted(r.statuses.items()))
            after = r.final if r.outcome is not None else f"{r.final} (unchanged)"
            table.add_row(str(r.round), str(r.sampled), str(r.correct), str(r.kept_rows), verdicts, after)
        console.print(table)
    if report.grpo is not None:
        g = report.grpo
        verdicts = ", ".join(f"{n} {s}" for s, n in sorted(g.statuses.items()))
        resumed = f"; resumed from {g.checkpoint}" if g.checkpoint else ""
        console.print(f"  {g.reward_calls} reward batches, {g.rollouts} rollouts ({verdicts}), {g.evaluated} judged, "
                      f"{g.clipped} rewards clipped; {g.db_candidates} codes written to {report.db_path}{resumed}",
                      highlight=False, soft_wrap=True)


def render_collect(summary: CollectSummary, console: Console) -> None:
    accepted = sum(p.accepted for p in summary.pairs)
    table = Table(title=f"SFT set: {accepted} accepted answers, {summary.rows} rows (each answer under every prompt "
                        "it is paired with)")
    width = min(30, max((len(p.task) for p in summary.pairs), default=4))
    table.add_column("task", min_width=width, overflow="fold")
    table.add_column("proposer", overflow="fold")
    for col in ("tries", "accepted"):
        table.add_column(col, justify="right")
    table.add_column("stopped")
    for p in summary.pairs:
        table.add_row(p.task, p.proposer, str(p.tries), str(p.accepted), p.stopped)
    console.print(table)
    for e in summary.errors[:10]:
        console.print(f"[yellow]{e}[/yellow]")
    console.print(f"{summary.asked} model calls, {summary.evaluated} evaluations; written {summary.out} and "
                  f"{summary.dataset}; every try is in {summary.db_path}")


def render_bench(report: BenchReport, console: Console) -> None:
    console.print(f"[bold]bench[/bold] of {report.proposer}: {len(report.tasks)} tasks, k = {report.k} samples each",
                  highlight=False, soft_wrap=True)
    table = Table(title="best correct speedup per task")
    width = min(30, max((len(t.task) for t in report.tasks), default=4))
    table.add_column("task", min_width=width, overflow="fold")
    for col in ("samples", "correct", "vs eager", "vs compile"):
        table.add_column(col, justify="right")
    for t in report.tasks:
        table.add_row(t.task, str(t.samples), str(t.correct), speedup_text(t.best_speedup),
                      speedup_text(t.best_vs_compile))
    console.print(table)
    ks = sorted({1, report.k})
    m = Table(title="pass@k, fast_p@k (mean over tasks)")
    m.add_column("metric")
    for j in ks:
        m.add_column(f"@{j}", justify="right")
    m.add_row("pass", *(percent_text(report.pass_at[j]) for j in ks))
    for p in report.ps:
        m.add_row(f"fast_{p:g}", *(percent_text(report.fast_at[p][j]) for j in ks))
    console.print(m)
    console.print(f"solved {report.solved}/{len(report.tasks)}; best speedup vs eager: geomean "
                  f"{speedup_text(report.geomean_eager)}, median {speedup_text(report.median_eager)} (solved tasks), "
                  f"geomean {speedup_text(report.geomean_eager_all)} (unsolved as 1.00x); vs torch.compile: geomean "
                  f"{speedup_text(report.geomean_compile)}, median {speedup_text(report.median_compile)}",
                  highlight=False)
    verdicts = ", ".join(f"{n} {s}" for s, n in sorted(report.statuses.items()))
    missing = f"; {report.missing_samples} samples missing (counted as failures)" if report.missing_samples else ""
    console.print(f"verdicts: {verdicts}{missing}", highlight=False)
    if report.throughput is not None:
        console.print(f"judge: {report.throughput.describe()}", highlight=False, soft_wrap=True)


def render_turn_bench(report: TurnBenchReport, console: Console) -> None:
    """The last turn's bench, then pass@k and fast_p@k by turn, then T turns against T samples."""
    console.print(f"after {report.turns} turns (each sample's best so far):", highlight=False)
    render_bench(report.by_turn[-1], console)
    ks = sorted({1, report.k})
    table = Table(title=f"by turn: each sample's best of its first t turns ({report.k} samples per task)")
    table.add_column("turn", justify="right")
    for j in ks:
        table.add_column(f"pass@{j}", justify="right")
    for p in report.ps:
        for j in ks:
            table.add_column(f"fast_{p:g}@{j}", justify="right")
    table.add_column("correct at turn", justify="right")
    table.add_column("geomean vs eager", justify="right")
    for t, (r, own) in enumerate(zip(report.by_turn, report.correct_at_turn), 1):
        table.add_row(str(t), *(percent_text(r.pass_at[j]) for j in ks),
                      *(percent_text(r.fast_at[p][j]) for p in report.ps for j in ks), percent_text(own),
                      speedup_text(r.geomean_eager_all))
    console.print(table)
    budget = Table(title="equal budget: t model calls per task, as 1 sample x t turns or t samples x 1 turn")
    budget.add_column("t", justify="right")
    budget.add_column("pass: t turns", justify="right")
    budget.add_column("pass: t samples", justify="right")
    for p in report.ps:
        budget.add_column(f"fast_{p:g}: t turns", justify="right")
        budget.add_column(f"fast_{p:g}: t samples", justify="right")
    for b in report.budget:
        budget.add_row(str(b.calls), percent_text(b.serial_pass), percent_text(b.parallel_pass),
                       *(text for p in report.ps
                         for text in (percent_text(b.serial_fast[p]), percent_text(b.parallel_fast[p]))))
    console.print(budget)
    if report.k < report.turns:
        console.print(f"t samples x 1 turn needs t <= k: ask --k {report.turns} or more for the whole table",
                      highlight=False)


def render_explained(items: list[Explained], console: Console, *, header: str) -> None:
    """`kernelrl reward`: each completion's verdict, then each step to what training pays."""
    console.print(header, highlight=False, soft_wrap=True)
    for e in items:
        r = e.result
        if r is None:
            verdict = "no code: the answer holds no complete code block"
        else:
            verdict = r.status.value
            if r.speedup is not None:
                verdict += " " + speedup_text(r.speedup)
                if r.speedup_ci:
                    verdict += f" [{min(r.speedup_ci):.3g}, {max(r.speedup_ci):.3g}]"
            if e.reused_from is not None:
                verdict += f" (the stored verdict of candidate {e.reused_from}: the same source, judged before)"
            elif r.message and r.status.value != "correct":
                verdict += f": {r.message.splitlines()[0][:200]}"
        console.print(f"[bold]{e.label}[/bold]: {verdict}", highlight=False, soft_wrap=True)
        if e.raw is None:
            console.print(f"  no reward ({e.excluded.value if e.excluded else 'none'}): training leaves it out",
                          highlight=False, soft_wrap=True)
            continue
        terms = " + ".join(f"{name} {value:+.3f}" for name, value in e.parts.items())
        console.print(f"  raw reward {e.raw:+.3f} = {terms}" + ("  (within noise: paid as 1.00x)" if e.within_noise
                                                               else ""), highlight=False, soft_wrap=True)
        if e.copy is not None:
            which = f"version {e.copy.version}" if e.copy.version is not None else "a shown version"
            console.print(f"  copy of {which}: {e.copy.reason}; paid at most as no speedup", highlight=False,
                          soft_wrap=True)
        elif r is not None and r.speedup is not None:
            console.print("  not a copy of any shown version", highlight=False, soft_wrap=True)
        if e.band is not None:
            console.print(f"  clip: the window's band [{e.band[0]:+.3f}, {e.band[1]:+.3f}]; "
                          + (f"damped to {e.band[1]:+.3f}" if e.clipped else "not clipped (only what lies above the band "
                                                                            "is lowered)"),
                          highlight=False, soft_wrap=True)
        elif e.parts.get("speedup") is not None:
            console.print("  clip: the task's window is too short to clip yet", highlight=False, soft_wrap=True)
        paid = "nothing" if e.value is None else f"{e.value:+.3f}"
        console.print(f"  [bold]paid {paid}[/bold]", highlight=False, soft_wrap=True)
