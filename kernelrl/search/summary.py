"""What a search did: why it stopped, and per task, how many candidates and the best speedup.

`render_summary` prints one on a console. Guarantees: plain frozen records; counts are of this
run, tokens of the whole run (a resumed run counts what it spent before).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kernelrl.judge.timing.throughput import Throughput

if TYPE_CHECKING:
    from rich.console import Console


class StopReason(str, enum.Enum):
    BUDGET = "budget"  # every task used its candidate budget (or gave up)
    TOKENS = "tokens"
    WALL_TIME = "wall_time"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True, kw_only=True)
class TaskSummary:
    task: str
    candidates: int  # stored in this run
    evaluated: int
    correct: int
    best_speedup: float | None  # over this run's correct candidates; None: none correct
    best_candidate: int | None
    gave_up: str | None = None  # why the task stopped before its budget, if it did


@dataclass(frozen=True, kw_only=True)
class SearchSummary:
    run_id: int
    resumed: bool
    stop_reason: StopReason
    tasks: tuple[TaskSummary, ...]
    prompt_tokens: int  # over the whole run
    completion_tokens: int
    evaluations: int  # evaluator calls made by this invocation
    reused: int  # candidates whose result came from the database or a shared evaluation
    elapsed_s: float
    errors: tuple[str, ...] = ()
    throughput: Throughput | None = None  # this invocation's verdicts per hour of its run, and where they went


def render_summary(summary: SearchSummary, console: Console) -> None:
    """The summary as `kernelrl optimize` prints it: a table of the tasks, then the totals and the judge's throughput."""
    from rich.table import Table

    ending = {"budget": "every task used its budget", "tokens": "stopped: the token budget is spent",
              "wall_time": "stopped: the wall-time limit is reached",
              "interrupted": "stopped by Ctrl-C (`--resume` continues it)"}.get(summary.stop_reason.value,
                                                                                 summary.stop_reason.value)
    table = Table(title=f"run {summary.run_id}{' (resumed)' if summary.resumed else ''}: {ending}")
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
    if summary.throughput is not None and summary.throughput.evaluations:
        console.print(f"judge: {summary.throughput.describe()}", highlight=False, soft_wrap=True)
