"""The run's state: which run this is, each task's chains, the tokens spent, and why it stops.

`open_run` starts a run in the database, or with `config.resume` reopens the database's latest search
one and rebuilds each task's chains from its stored candidates (`kernelrl.search.chains.rebuild`:
a chain's step and best, its unfinished episode). `RunState.judged` applies one verdict to its
task and chain.

Guarantees:
- a chain's best and a task's best change only to a `better` candidate (correct and strictly
  faster, `kernelrl.search.chains.better`); every `exchange_every` steps a chain adopts the task's
  best of this run when that is better than its own;
- in a multi-turn run a verdict joins its chain's episode only when its turn is the one the
  episode waits for;
- tokens count the whole run: a resumed run starts from what it spent before.

Only the loop's thread reads or changes a `RunState`. Does not write to the database (beyond
opening the run: its tasks and its row), print, or start anything.
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
from kernelrl.search.database import Database
from kernelrl.search.records import BaselineRecord, CandidateRecord, CandidateState
from kernelrl.search.summary import StopReason
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


def open_run(config: SearchConfig, tasks: list[Task], db: Database) -> RunState:
    """A new run of `tasks`, or with `config.resume` the database's latest search run, its chains rebuilt.
    The tasks are registered in `db` by the run's builder (`kernelrl.run_parts.build_run`); one
    missing there, or registered with another source or size, is refused (`ValueError`): results
    stored for it would be judged against a task the database does not describe."""
    started = time.monotonic()
    registered = {r.name: r for r in db.tasks()}
    stale = [t.name for t in tasks if (r := registered.get(t.name)) is None
             or (r.source_hash, r.size) != (t.identity_hash, config.eval.size)]
    if stale:
        raise ValueError(f"tasks not registered in {config.db_path} as this run's (at size {config.eval.size}): "
                         f"{', '.join(stale)}; the run's builder, kernelrl.run_parts.build_run, registers them")
    latest = None
    if config.resume:  # the latest search: a bench, a collection or a training stage may share the file
        latest = max((r for r in db.runs() if not r.config.get("stage")), key=lambda r: r.id, default=None)
    # the task names are stored with the run so a report counts a task that got no candidate
    stored = {**config.to_json(), "task_names": [t.name for t in tasks]}
    if latest is not None:
        run_id, resumed = latest.id, True
        db.reopen_run(latest.id, stored)
    else:
        run_id, resumed = db.start_run(stored), False
    prompt_tokens, completion_tokens = db.token_totals(run_id)
    states = {}
    for t in tasks:
        ts = TaskState(task=t, chains=[Chain(task=t.name, index=i) for i in range(config.chains)])
        states[t.name] = ts
        if resumed:
            rebuild(ts, db, run_id, episodes=config.episode, template_dir=config.template_dir)
    return RunState(config=config, run_id=run_id, resumed=resumed, tasks=states, started=started,
                    prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
