"""What a search did: why it stopped, and per task, how many candidates and the best speedup.

Guarantees: plain frozen records; counts are of this run, tokens of the whole run (a resumed
run counts what it spent before).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kernelrl.judge.timing.throughput import Throughput


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
