"""The run's state: which run this is, each task's chains, the tokens spent, and why it stops.

`open_run` is the state of the run whose row the run's builder wrote (new, or with
`config.resume` the database's latest search reopened); a resumed run's chains are rebuilt from
its stored candidates (`kernelrl.search.chains.rebuild`: a chain's step and best, its unfinished
episode). `RunState.judged` applies one verdict to its task and chain.

Guarantees:
- a chain's best and a task's best change only to a `better` candidate (correct and strictly
  faster, `kernelrl.search.chains.better`); every `exchange_every` steps a chain adopts the task's
  best of this run when that is better than its own;
- in a multi-turn run a verdict joins its chain's episode only when its turn is the one the
  episode waits for;
- tokens count the whole run: a resumed run starts from what it spent before.

Only the loop's thread reads or changes a `RunState`. Does not write to the database, print, or
start anything.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kernelrl.result import EvalResult
from kernelrl.search.chains import Chain, TaskState, better, rebuild
from kernelrl.search.config import SearchConfig
from kernelrl.search.summary import StopReason
from kernelrl.store import Database
from kernelrl.store.records import BaselineRecord, CandidateRecord, CandidateState
from kernelrl.tasks.task import Task

if TYPE_CHECKING:
    from kernelrl.judge.harness.profile import TaskProfile


@dataclass(kw_only=True)
class RunState:
    config: SearchConfig
    run_id: int
    resumed: bool  # continues the database's latest search run
    tasks: dict[str, TaskState]  # by name, in the run's task order
    started: float  # time.monotonic() when this invocation started
    prompt_tokens: int = 0  # over the whole run
    completion_tokens: int = 0
    profiles: dict[str, TaskProfile | None] = field(default_factory=dict)  # a task's profile, once read (None: none)
    stop_reason: StopReason | None = None  # set when no new model call may start

    def proposing(self) -> bool:
        """Is a model call under way?"""
        return any(ts.in_flight for ts in self.tasks.values())

    def spent(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

    def judged(self, rec: CandidateRecord, result: EvalResult,
               baseline: Callable[[], BaselineRecord | None]) -> TaskState:
        """A stored verdict joins its task and chain (the module's guarantees); the chain is free
        for its next step. `baseline()` reads the task's baseline, which a turn's feedback shows."""
        rec = dataclasses.replace(rec, result=result, state=CandidateState.EVALUATED)
        ts = self.tasks[rec.task]
        chain = ts.chains[rec.chain]
        ts.evaluated += 1
        ts.correct += rec.is_correct
        if chain.episode is not None and rec.meta.turn == chain.episode.turn:
            chain.record_turn(rec, result, baseline())
        if better(rec, chain.best):
            chain.best = rec
        if better(rec, ts.best):
            ts.best = rec
        every = self.config.exchange_every
        if every and chain.step % every == 0 and better(ts.best, chain.best):
            chain.best = ts.best  # exchange: adopt the task's best of this run
        chain.busy = False
        return ts


def open_run(config: SearchConfig, tasks: list[Task], db: Database, *, run_id: int, resumed: bool) -> RunState:
    """The state of run `run_id` of `tasks` (its row written by the run's builder,
    `kernelrl.run_parts.build_run`, which registers the tasks and refuses one registered otherwise);
    a `resumed` run's chains are rebuilt from its stored candidates and its tokens counted."""
    started = time.monotonic()
    prompt_tokens, completion_tokens = db.token_totals(run_id)
    states = {}
    for t in tasks:
        ts = TaskState(task=t, chains=[Chain(task=t.name, index=i) for i in range(config.chains)])
        states[t.name] = ts
        if resumed:
            rebuild(ts, db, run_id, episodes=config.episode, template_dir=config.template_dir)
    return RunState(config=config, run_id=run_id, resumed=resumed, tasks=states, started=started,
                    prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
