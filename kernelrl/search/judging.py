"""Judging: what a search sends to the judge (candidates, baselines, task profiles) and what it
does with the outcomes.

A stored candidate (`submit`) gets its verdict in one of four ways: an answer without code is
`no_code` at once (`EvalResult.no_code`); a source judged before for its task under the run's
evaluator config (`kernelrl.judge.reuse.judged_before` on the run database: task name and
source, source hash, fingerprint; never a `judge_error` or `task_error`) takes the stored
verdict; a source being judged for another chain waits for that evaluation and shares it; any
other joins the batch being gathered. `start_batch` sends the
whole batch to `evaluate_batch` (candidates of one task are timed together with one reference
measurement) when no model call is under way and no task is still reading
its profile (after which it asks), when its oldest candidate has waited `batch_wait_s` (plus
`PROFILE_HOLD_S` while profiles are read), or once the run stops asking; a streaming evaluator hands each result
over as soon as its task's group ends, the rest land when the batch returns. A streaming
evaluator (`kernelrl.judge.contract.SearchJudge`: one that shares its places among the batches it
is given at once) takes the next batch while the last one's slowest groups still run, made of
the candidates whose tasks have no group in it (a task's candidates are still timed together);
any other judge takes one batch at a time.

Guarantees:
- a source is judged at most once per task and fingerprint in a run, and two chains proposing
  the same source at once share one evaluation;
- when the evaluator itself breaks (not the candidate) nothing is stored: the candidates stay
  `proposed` and a resume judges them; a verdict of status `task_error` stores nothing and gives
  the task up with its reason, the other tasks go on;
- a task's first prompt waits for its profile (shapes, constants, what its model is: read by the
  evaluator's reference worker, never in this process) and, with an injected `measure_baseline`,
  for its baseline; a task whose reference fails is given up with its reason.

Only the loop's thread calls these methods. Does not decide what the model is asked next.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kernelrl.candidate import Candidate
from kernelrl.judge.reuse import JudgedKey, judged_before
from kernelrl.result import EvalResult, Status
from kernelrl.search.output import MeasuredBaseline, RunOutput
from kernelrl.search.state import RunState
from kernelrl.search.workers import Workers
from kernelrl.store import Database
from kernelrl.store.records import CandidateRecord
from kernelrl.tasks.task import Task

if TYPE_CHECKING:
    from kernelrl.judge.harness.profile import TaskProfile

BatchFn = Callable[[list[tuple[Task, Candidate]]], list[EvalResult]]
BaselineFn = Callable[[Task], MeasuredBaseline]  # e.g. a kernelrl.judge.timing.baseline.Baseline
ProfileFn = Callable[[Task], "TaskProfile | None"]
Key = tuple[str, str]  # (task, source hash)
# How much longer than `batch_wait_s` a batch waits for tasks still reading their profiles.
PROFILE_HOLD_S = 60.0


class Judging:
    def __init__(self, run: RunState, out: RunOutput, db: Database, workers: Workers, *, evaluate_batch: BatchFn,
                 streams: bool = False, measure_baseline: BaselineFn | None = None,
                 profile: ProfileFn | None = None) -> None:
        self.run = run
        self.config = run.config
        self.out = out
        self.db = db
        self.workers = workers
        self.evaluate_batch = evaluate_batch
        self.streams = streams  # the judge hands each result over as soon as it is final (`on_result`)
        self.measure_baseline = measure_baseline
        self.profile = profile
        self.eval_pending: list[Key] = []  # keys waiting for a batch, oldest first
        self.pending_since: float | None = None
        self.in_batches: set[Key] = set()  # sent in a batch under way, no verdict yet
        self.batches_running = 0
        self.evals_in_flight: dict[Key, list[CandidateRecord]] = {}  # waiting records; the first is judged
        self.baselines_in_flight = 0

    @property
    def batch_running(self) -> bool:
        return self.batches_running > 0

    def busy(self) -> bool:
        return bool(self.evals_in_flight) or self.baselines_in_flight > 0 or self.batch_running

    # ------------------------------------------------------------ candidates
    def submit(self, rec: CandidateRecord) -> None:
        """A stored candidate, to be judged (the module docstring says how)."""
        cfg = self.config
        if not rec.source.strip():
            result = EvalResult.no_code(rec.task, device=cfg.eval.device, size=cfg.eval.size, policy=cfg.eval.policy,
                                        candidate_hash=rec.hash)
            self.out.no_code(rec, result)
            self._settled(rec, result)
            return
        known = judged_before(self.db, JudgedKey.of(self.run.tasks[rec.task].task, rec.hash, self.out.fingerprint))
        if known is not None and known.candidate_id is not None:
            self.out.shared(rec, known.candidate_id, known.result)
            self._settled(rec, known.result)
            return
        key = (rec.task, rec.hash)
        if key in self.evals_in_flight:  # the same source is being evaluated for another chain
            self.evals_in_flight[key].append(rec)
            return
        self.evals_in_flight[key] = [rec]
        self.eval_pending.append(key)
        if self.pending_since is None:
            self.pending_since = time.monotonic()

    def start_batch(self) -> None:
        """Judge every waiting candidate in one batch, when the moment is right (module docstring)."""
        # A batch at a time, but for a streaming evaluator, which takes the tasks not in one under way.
        judged = {k[0] for k in self.in_batches}
        ready = [k for k in self.eval_pending if k[0] not in judged] if self.streams else self.eval_pending
        if (self.batch_running and not self.streams) or not ready:
            return
        waited = time.monotonic() - (self.pending_since or time.monotonic())
        # A task still reading its profile asks its first question as soon as the profile is in:
        # the run's first batch waits for those too (one batch runs at a time, so a first batch of
        # one candidate holds every other task's for its whole length).
        profiles = any(ts.profile_pending for ts in self.run.tasks.values())
        hold = self.config.batch_wait_s + (PROFILE_HOLD_S if profiles else 0.0)
        if (self.run.proposing() or profiles) and waited < hold and self.run.stop_reason is None:
            return
        keys = ready
        self.eval_pending = [k for k in self.eval_pending if k not in keys]
        self.pending_since = time.monotonic() if self.eval_pending else None  # the rest wait from now
        self.in_batches.update(keys)
        items = []
        for key in keys:
            rec = self.evals_in_flight[key][0]
            items.append((self.run.tasks[rec.task].task, Candidate(source=rec.source, origin=f"candidate {rec.id}")))
        self.batches_running += 1  # results stream in as each task's group ends, where the evaluator can:
        stream = ({"on_result": lambda i, r: self.workers.post(functools.partial(self.on_result, keys[i], r))}
                  if self.streams else {})
        self.workers.spawn("evaluation", self.workers.batch_slots if self.streams else self.workers.eval_slots,
                           lambda: self.evaluate_batch(items, **stream), functools.partial(self.on_batch, keys))

    def on_batch(self, keys: list[Key], out: list[EvalResult] | BaseException) -> None:
        """A batch returned: its verdicts not streamed already land, in order."""
        self.batches_running -= 1
        self.in_batches.difference_update(keys)
        if isinstance(out, BaseException) or len(out) != len(keys):
            err = out if isinstance(out, BaseException) else RuntimeError(f"{len(out)} results for {len(keys)}")
            for key in (k for k in keys if k in self.evals_in_flight):  # not streamed already
                self.on_result(key, err)
            return
        for key, result in ((k, r) for k, r in zip(keys, out) if k in self.evals_in_flight):
            self.on_result(key, result)
        self.out.known_baselines({k[0] for k in keys})

    def on_result(self, key: Key, out: EvalResult | BaseException) -> None:
        """The verdict on one source (or the evaluator's failure): stored for every candidate waiting on it."""
        self.in_batches.discard(key)  # its task's group ended: the task's next candidates may go
        waiting = self.evals_in_flight.pop(key)
        first, rest = waiting[0], waiting[1:]
        if isinstance(out, BaseException):
            # The evaluator itself broke (not the candidate): store nothing, so a resume retries.
            self.out.error(f"{key[0]}: evaluation of candidate {first.id} failed: {type(out).__name__}: {out}", "red")
            self._free(waiting)
            return
        if out.status is Status.TASK_ERROR:
            # The task, not the candidate, failed: nothing to store, and the task stops here.
            ts = self.run.tasks[key[0]]
            ts.gave_up = ts.gave_up or f"task error: {out.message}"
            self.out.error(f"{key[0]}: the task's reference fails: {out.message}", "red")
            self._free(waiting)
            return
        # the task's baseline, measured in its group, stored with its first verdict (not when the whole
        # batch returns): run pages show speedups against torch.compile while the run goes
        self.out.known_baselines({key[0]})
        out = self.out.verdict(first, out)
        self._settled(first, out)
        for rec in rest:
            self.out.shared(rec, first.id, out)
            self._settled(rec, out)

    def _free(self, waiting: list[CandidateRecord]) -> None:
        for rec in waiting:
            self.run.tasks[rec.task].chains[rec.chain].busy = False

    def _settled(self, rec: CandidateRecord, result: EvalResult) -> None:
        cfg = self.config.eval
        ts = self.run.judged(rec, result, lambda: self.db.get_baseline(rec.task, cfg.device, cfg.size))
        self.out.judged(ts)

    # ------------------------------------------------------------ profiles and baselines
    def start_profiles(self) -> None:
        if self.profile is None:
            return
        for name, ts in self.run.tasks.items():
            ts.profile_pending = True
            self.workers.spawn("profile", self.workers.profile_slots, functools.partial(self.profile, ts.task),
                               functools.partial(self.on_profile, name))

    def on_profile(self, name: str, out: TaskProfile | BaseException | None) -> None:
        ts = self.run.tasks[name]
        ts.profile_pending = False
        if isinstance(out, BaseException):
            ts.gave_up = f"task error: {out}"
            self.out.error(f"{name}: the task's reference fails: "
                           f"{str(out).splitlines()[0] if str(out) else type(out).__name__}", "red")
            return
        self.run.profiles[name] = out

    def start_baselines(self) -> None:
        if self.measure_baseline is None:
            return
        for name, ts in self.run.tasks.items():
            if self.db.get_baseline(name, self.config.eval.device, self.config.eval.size) is None:
                ts.baseline_pending = True
                self.baselines_in_flight += 1
                self.workers.spawn("baseline", self.workers.eval_slots,
                                   functools.partial(self.measure_baseline, ts.task),
                                   functools.partial(self.on_baseline, name))

    def on_baseline(self, name: str, out: MeasuredBaseline | BaseException) -> None:
        self.baselines_in_flight -= 1
        self.run.tasks[name].baseline_pending = False
        if isinstance(out, BaseException):
            self.out.error(f"{name}: baseline measurement failed: {type(out).__name__}: {out}", "yellow")
            return
        self.out.baseline(name, out)
