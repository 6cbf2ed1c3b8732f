"""What a search run writes and says: candidates, verdicts and baselines into the run database;
errors, a progress bar per task and the status line on the console; the summary it returns.

Guarantees:
- every write is one committed transaction of the database (`kernelrl.store`), made on
  the loop's thread, the only thread that touches the database;
- a verdict is stored under the evaluator config it was judged by (its fingerprint): an injected
  judge's verdict that carries none is taken to be judged under the run's config;
- a candidate that shares another's verdict (the same source judged for another chain, or stored
  before) is stored as reused, pointing at the candidate whose verdict it shares;
- a baseline the evaluator measured inside its groups is stored once per task, device and size;
- every error said on the console is in the summary's `errors`; a task's bar shows its judged
  candidates of its budget and its best speedup (`kernelrl.search.activity`).

Decides nothing: what is stored, and when, is the scheduler's and the judging's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from rich.console import Console

from kernelrl.judge.timing.throughput import Throughput
from kernelrl.result import EvalResult
from kernelrl.search.activity import LockWatch, SearchActivity, SearchView
from kernelrl.search.chains import TaskState, fmt_speedup
from kernelrl.search.state import RunState
from kernelrl.search.summary import SearchSummary, StopReason, TaskSummary
from kernelrl.store import Database
from kernelrl.store.records import CandidateRecord, NewCandidate
from kernelrl.tasks.task import Task

if TYPE_CHECKING:
    from kernelrl.judge.timing.baseline import Baseline


class MeasuredBaseline(Protocol):
    """What the search stores of a baseline it measured (`kernelrl.judge.timing.baseline.Baseline` is one;
    its `compile_speedup_ci` is read where the object has one)."""

    @property
    def eager_ms(self) -> float: ...

    @property
    def compile_ms(self) -> float | None: ...


class RunOutput:
    def __init__(self, run: RunState, db: Database, console: Console, *, fingerprint: str,
                 known_baseline: Callable[[Task], Baseline | None] | None = None, watch: LockWatch | None = None) -> None:
        self.run = run
        self.db = db
        self.console = console
        # the evaluator config results are judged under: stored results are reused only under it
        self.fingerprint = fingerprint
        self.known_baseline = known_baseline  # baselines the evaluator measured inside its groups
        self.watch = watch  # the timing lock, whose holder the status line names
        self.fresh: list[EvalResult] = []  # verdicts of the evaluator stored by this invocation
        self.reused = 0  # candidates stored with a verdict shared from another
        self.errors: list[str] = []
        self.activity: SearchActivity | None = None

    # ------------------------------------------------------------ the database
    def candidate(self, new: NewCandidate) -> CandidateRecord:
        """A model's answer, stored before it is judged."""
        return self.db.add_candidate(new)

    def verdict(self, rec: CandidateRecord, result: EvalResult) -> EvalResult:
        """The evaluator's verdict on `rec`, as stored."""
        self.fresh.append(result)
        if not result.config_fingerprint:
            # An injected judge is taken to judge under the run's evaluator config.
            result = dataclasses.replace(result, config_fingerprint=self.fingerprint)
        self.db.store_result(rec.id, result)
        return result

    def no_code(self, rec: CandidateRecord, result: EvalResult) -> None:
        """The verdict on an answer without code, reached without the evaluator."""
        self.db.store_result(rec.id, result)

    def shared(self, rec: CandidateRecord, source_id: int, result: EvalResult) -> None:
        """`rec` takes the verdict of candidate `source_id` (the same source)."""
        self.db.store_reused_result(rec.id, source_id, result)
        self.reused += 1

    def baseline(self, name: str, measured: MeasuredBaseline) -> None:
        """A task's baseline measured by the search (eager_ms, compile_ms, compile_speedup_ci)."""
        cfg = self.run.config.eval
        self.db.put_baseline(task=name, device=cfg.device, size=cfg.size, eager_ms=float(measured.eager_ms),
                             compile_ms=measured.compile_ms,
                             compile_ci=getattr(measured, "compile_speedup_ci", None))

    def known_baselines(self, names: set[str]) -> None:
        """The baselines the evaluator measured for these tasks, where none is stored yet."""
        if self.known_baseline is None:
            return
        cfg = self.run.config.eval
        for name in names:
            if self.db.get_baseline(name, cfg.device, cfg.size) is not None:
                continue
            b = self.known_baseline(self.run.tasks[name].task)
            if b is not None:
                self.db.put_baseline(task=name, device=cfg.device, size=cfg.size, eager_ms=float(b.eager_ms),
                                     compile_ms=b.compile_ms, compile_ci=b.compile_speedup_ci)

    # ------------------------------------------------------------ the console
    def error(self, msg: str, colour: str) -> None:
        self.errors.append(msg)
        self.console.print(f"[{colour}]{msg}[/{colour}]")

    def say(self, markup: str) -> None:
        self.console.print(markup)

    @contextlib.contextmanager
    def showing(self) -> Iterator[None]:
        """A bar per task, and the status line under them, while the block runs."""
        self.activity = SearchActivity(self.console, self.watch)
        progress = self.activity.progress
        with progress:
            for name, ts in self.run.tasks.items():
                ts.progress_id = progress.add_task(name, total=self.run.config.budget, completed=ts.evaluated,
                                                   best=fmt_speedup(ts.best), eta="-")
            yield

    def judged(self, ts: TaskState) -> None:
        """A verdict of `ts` landed: its bar moves."""
        if self.activity is not None and ts.progress_id is not None:
            self.activity.progress.update(ts.progress_id, completed=ts.evaluated, best=fmt_speedup(ts.best))

    def tick(self, search: SearchView, *, final: bool = False) -> None:
        if self.activity is not None:
            self.activity.tick(search, final=final)

    # ------------------------------------------------------------ the summary
    def summary(self) -> SearchSummary:
        run = self.run
        tasks = tuple(TaskSummary(task=name, candidates=ts.proposed, evaluated=ts.evaluated, correct=ts.correct,
                                  best_speedup=ts.best.speedup if ts.best else None,
                                  best_candidate=ts.best.id if ts.best else None, gave_up=ts.gave_up)
                      for name, ts in run.tasks.items())
        elapsed = time.monotonic() - run.started
        return SearchSummary(run_id=run.run_id, resumed=run.resumed, stop_reason=run.stop_reason or StopReason.BUDGET,
                             tasks=tasks, prompt_tokens=run.prompt_tokens, completion_tokens=run.completion_tokens,
                             evaluations=len(self.fresh), reused=self.reused, elapsed_s=elapsed,
                             errors=tuple(self.errors), throughput=Throughput.of(self.fresh, elapsed))
