"""The dispatcher: worker threads that take jobs from the store and hand them to the backend.

Guarantees:
- jobs are taken oldest first, `workers` at a time (one per lane by default), each as one
  `evaluate_batch` call (a profile job: one `profile` call per task), and their results are
  written back with `JobStore.complete` (exactly once, all items together);
- a job whose results cannot be stored (the store raised: disk full, a result that does not
  serialise) ends `failed` with the reason (`JobStore.fail`), and its waiters are woken: no job
  stays `running` while the server runs;
- a job whose batch raises (the backend's own failure: an actor died, a lane broke) is queued
  again after a pause, up to `max_attempts` starts; at the last attempt its items are evaluated
  one at a time, so an item that still breaks the backend gets a `task_error` result of its own
  (a profile, an error of its own) and the others keep their verdicts; a task whose reference
  fails (`TaskError`) is a profile's answer, not a backend failure; a job started `max_attempts` times without finishing (the
  server died each time) is closed with `task_error` results. No job stays queued for ever;
- the dispatcher only turns jobs into `evaluate_batch` calls: verdicts are the backend's;
- per-client privacy: each candidate goes to the backend as a `ClientCandidate`, whose identity
  (the evaluator's result-cache key) is its source and its job's owner, so a client's verdicts
  and timings are reused only for that client: another client's identical program is judged
  anew, in its own time, and nothing in its answer tells it someone sent it before. Results
  carry the source's own hash (`candidate_hash`), as the client computes it.

Does not hide what shared caches below the result cache reveal by time: compiled extensions are
cached by their native source and device (`build_cached`, a short build time), task baselines
and profiles by task; a client can learn that the same native source or task was built or
measured before, not by whom, nor any result of it.

Does not time out a backend call: the evaluator's own deadlines bound each evaluation.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kernelrl.backends.api import JobKind, ProfileOutcome
from kernelrl.candidate import Candidate, source_hash
from kernelrl.result import EvalResult, Status
from kernelrl.serve.backend import EvalBackend
from kernelrl.serve.jobs import ClaimedJob, JobStore
from kernelrl.tasks.task import Task, TaskError

Outcome = EvalResult | ProfileOutcome

log = logging.getLogger("kernelrl.serve")

RATE_WINDOW_S = 600.0  # evaluations/s for Retry-After is measured over this much recent time


@dataclass(frozen=True, kw_only=True, slots=True)
class DispatchStats:
    workers: int
    busy: int
    evaluations: int  # recorded by this process
    jobs_completed: int
    job_retries: int  # jobs queued again after a backend failure
    backend_failures: int
    rate_per_s: float | None  # recent evaluations per second; None before the first job finishes


def failure_result(task: Task, candidate: str, job: ClaimedJob, message: str, errors: list[str] | None = None
                   ) -> Outcome:
    """No verdict: the evaluation could not be carried out (not the candidate's fault)."""
    if job.kind is JobKind.PROFILE:
        return ProfileOutcome(task=task.name, error=message)
    return EvalResult(task=task.name, status=Status.TASK_ERROR, message=message, errors=errors or [],
                      size=str(job.size), policy=str(job.policy), candidate_hash=source_hash(candidate))


@dataclass(frozen=True, kw_only=True)
class ClientCandidate(Candidate):
    """A candidate as one client sent it: its identity in the evaluator (`hash`, the result
    cache's key) is its source and the client's name, so results are reused for that client only."""

    client: str = ""

    @property
    def hash(self) -> str:
        return source_hash(f"{len(self.client)}:{self.client}:{self.source}")


class Dispatcher:
    def __init__(self, store: JobStore, backend: EvalBackend, *, workers: int, max_attempts: int = 3,
                 on_complete: Callable[[str], None] | None = None, idle_poll_s: float = 0.5,
                 retry_pause_s: float = 2.0) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.store = store
        self.backend = backend
        self.workers = workers
        self.max_attempts = max_attempts
        self.on_complete = on_complete
        self.idle_poll_s = idle_poll_s
        self.retry_pause_s = retry_pause_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._busy = 0
        self._evaluations = 0
        self._jobs = 0
        self._retries = 0
        self._failures = 0
        self._recent: deque[tuple[float, int]] = deque()

    def start(self) -> None:
        for i in range(self.workers):
            t = threading.Thread(target=self._loop, name=f"kernelrl-dispatch-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def notify(self) -> None:
        """A job was queued: wake an idle worker now rather than at its next poll."""
        self._wake.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Take no new job; wait up to `timeout_s` for running ones. A job still running after
        that stays `running` in the store and is queued again at the next start."""
        self._stop.set()
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def stats(self) -> DispatchStats:
        with self._lock:
            now = time.monotonic()
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()
            rate = None
            if self._recent:
                span = max(now - self._recent[0][0], 1.0)
                rate = sum(n for _, n in self._recent) / span
            return DispatchStats(workers=self.workers, busy=self._busy, evaluations=self._evaluations,
                                 jobs_completed=self._jobs, job_retries=self._retries,
                                 backend_failures=self._failures, rate_per_s=rate)

    # ------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                job = self.store.claim()
            except Exception:  # a store error (disk full, say) must not end the worker
                log.exception("claiming a job failed")
                self._stop.wait(self.idle_poll_s)
                continue
            if job is None:
                self._wake.wait(self.idle_poll_s)
                self._wake.clear()
                continue
            with self._lock:
                self._busy += 1
            try:
                self._run(job)
            except Exception as e:
                if self._stop.is_set():  # the store may be closed: the next start queues it again
                    log.warning("job %s left running at shutdown; it is queued again at the next start", job.job_id)
                else:
                    log.exception("job %s could not be finished", job.job_id)
                    self._fail(job, f"the server could not finish this job (storing its results failed): "
                                    f"{type(e).__name__}: {e}")
            finally:
                with self._lock:
                    self._busy -= 1

    def _fail(self, job: ClaimedJob, reason: str) -> None:
        try:
            failed = self.store.fail(job.seq, reason)
        except Exception:  # the store is unusable: the job stays running (clients time out)
            log.exception("job %s: cannot mark it failed either", job.job_id)
            return
        if failed and self.on_complete is not None:
            self.on_complete(job.job_id)

    def _run(self, job: ClaimedJob) -> None:
        if job.attempts > self.max_attempts:
            msg = (f"the evaluation of this job was interrupted {job.attempts - 1} times (the server stopped "
                   "while judging it); no verdict")
            results: list[Outcome] | None = [failure_result(task, cand, job, msg) for _, task, cand in job.items]
        else:
            results = self._evaluate(job)
        if results is None:
            return  # queued again
        if self.store.complete(job.seq, [(idx, r) for (idx, _, _), r in zip(job.items, results)]):
            with self._lock:
                self._evaluations += len(results)
                self._jobs += 1
                self._recent.append((time.monotonic(), len(results)))
            if self.on_complete is not None:
                self.on_complete(job.job_id)

    def _evaluate(self, job: ClaimedJob) -> list[Outcome] | None:
        pairs: list[tuple[Task, Candidate]] = [(task, ClientCandidate(source=cand, client=job.owner))
                                               for _, task, cand in job.items]
        try:
            return self._call(pairs, job)
        except Exception as e:  # noqa: BLE001 - any evaluator failure is retried one by one
            with self._lock:
                self._failures += 1
            log.warning("job %s: backend failed (attempt %d of %d): %s", job.job_id, job.attempts,
                        self.max_attempts, e)
            if job.attempts < self.max_attempts:
                self._stop.wait(self.retry_pause_s * job.attempts)
                if self.store.requeue(job.seq):
                    with self._lock:
                        self._retries += 1
                    self.notify()
                return None
            if len(pairs) == 1:
                return [failure_result(pairs[0][0], pairs[0][1].source, job, f"the evaluator failed: {e}",
                                       [repr(e)])]
        # Last attempt: one item at a time, so an item that breaks the backend costs only its own verdict.
        out: list[Outcome] = []
        for task, cand in pairs:
            try:
                out.extend(self._call([(task, cand)], job))
            except Exception as e:  # noqa: BLE001 - any evaluator failure is the item's result
                out.append(failure_result(task, cand.source, job, f"the evaluator failed: {e}", [repr(e)]))
        return out

    def _call(self, pairs: list[tuple[Task, Candidate]], job: ClaimedJob) -> list[Outcome]:
        if job.kind is JobKind.PROFILE:
            return [self._profile(task, job) for task, _ in pairs]
        results = self.backend.evaluate_batch(pairs, size=job.size, policy=job.policy)
        if len(results) != len(pairs) or not all(isinstance(r, EvalResult) for r in results):
            raise RuntimeError(f"the backend returned {len(results)} results for {len(pairs)} items")
        return [dataclasses.replace(r, candidate_hash=source_hash(cand.source))
                if r.candidate_hash and r.candidate_hash == cand.hash else r for r, (_, cand) in zip(results, pairs)]

    def _profile(self, task: Task, job: ClaimedJob) -> ProfileOutcome:
        try:
            found = self.backend.profile(task, size=job.size)
        except TaskError as e:  # the task's own fault: the answer, not a backend failure
            first = (str(e).splitlines() or [type(e).__name__])[0]
            return ProfileOutcome(task=task.name, error=f"the task's reference fails: {first}")
        return ProfileOutcome(task=task.name, profile=found.to_dict() if found else None)
