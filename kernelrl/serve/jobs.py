"""The job store: every accepted job, its items, idempotency keys and results, in SQLite.

A job is one of two kinds: `evaluate` (items of a task and a candidate, each ending with an
`EvalResult`) or `profile` (one task, ending with a `ProfileOutcome`: what a reference worker
read about it). Both go through the same bounded queue and the same dispatcher.

Guarantees:
- a job is written (WAL, `synchronous=FULL`) before the server answers 202, so an accepted job
  survives a SIGKILL of the server, and a power cut; the file is the server's
  (`kernelrl.serve.store.ServerStore`: created readable by its owner only, its tables and their
  versions), shared with the session store;
- a job ends exactly once: `complete` records all of its results and marks it done in one
  transaction, and only if it is still running; `fail` marks a running job failed with the
  reason (its results could not be stored) and frees its idempotency keys, so a retry judges
  again; a job that was running when the server died is queued again by `recover` at the next
  start and evaluated again from scratch (evaluation is at-least-once, completion exactly once);
  after `max_attempts` starts it is closed with task_error results instead of being retried;
- jobs belong to the client that submitted them (its token's name, `owner`): `state` and `job`
  answer None for another owner's job, and idempotency keys are per owner;
- an idempotency key names one evaluation for as long as its job is kept: an item whose key is
  already stored is not evaluated again, its result is the stored item's (the first result); the
  same key with another task, candidate, size or policy is refused (`KeyConflict`);
- the queue is bounded: `submit` refuses (`QueueFull`) a job whose new evaluations would take
  the evaluations queued or running past the limit; items answered from keys cost nothing;
- `purge` removes finished jobs older than a cutoff, except those whose results a kept job
  reuses through a key (and jobs still waiting on another's result).

Does not run anything and does not parse task code beyond what the caller gives it; it is safe
to call from several threads (the server store's one connection and lock). One server per database file: the
server holds a lock file beside it (`kernelrl.serve.server`), since `recover` would otherwise
queue again jobs that another live server is running.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kernelrl.backends.api import JobKind, JobState, ProfileOutcome
from kernelrl.checks.policy import PolicyName
from kernelrl.result import EvalResult
from kernelrl.serve.store import StoreTables
from kernelrl.tasks.task import Size, Task

_ORDER = {JobState.QUEUED: 0, JobState.RUNNING: 1, JobState.DONE: 2}
FINISHED = (JobState.DONE, JobState.FAILED)


class QueueFull(Exception):
    """The job's evaluations do not fit the queue now; try again later."""

    def __init__(self, pending: int, wanted: int, limit: int) -> None:
        super().__init__(f"the queue is full: {pending} evaluations pending, this job adds {wanted}, limit {limit}")
        self.pending = pending
        self.wanted = wanted
        self.limit = limit


class KeyConflict(Exception):
    """An idempotency key is already stored for another evaluation."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ItemSpec:
    """One evaluation asked for: a task (already resolved, never executed), a candidate source
    ('' in a profile job), and an optional idempotency key."""

    task: Task
    candidate: str
    key: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Submitted:
    job_id: str
    n_items: int
    reused: int  # items answered from stored keys
    state: JobState


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimedJob:
    """A job taken for evaluation: the items it evaluates itself, with their indexes."""

    seq: int
    job_id: str
    kind: JobKind
    size: Size
    policy: PolicyName
    attempts: int  # including this one
    items: tuple[tuple[int, Task, str], ...]
    owner: str = ""  # the client that submitted it ('' without tokens)


@dataclass(frozen=True, kw_only=True, slots=True)
class JobView:
    job_id: str
    kind: JobKind
    state: JobState
    n_items: int
    results: list[dict[str, Any] | None]  # to_dict() of each item's result, None while pending
    attempts: int
    created_s: float
    finished_s: float | None
    error: str | None  # why a failed job failed


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreStats:
    jobs: dict[JobState, int]
    pending_items: dict[JobState, int]  # evaluations of queued / running jobs
    by_status: dict[str, int]  # evaluations recorded, by verdict
    finished_since: int  # evaluations recorded since the `since` time asked for


def task_to_json(task: Task) -> str:
    return json.dumps({"name": task.name, "source": task.source, "level": task.level, "suite": task.suite,
                       "presets": task.presets})


def task_from_json(text: str) -> Task:
    d = json.loads(text)
    return Task(name=d["name"], source=d["source"], level=d.get("level"), suite=d.get("suite", ""),
                presets=d.get("presets") or {})


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class JobStore(StoreTables):
    """The jobs of a reward server's database: on `store` (its connection and lock), or on a path
    (a `ServerStore` of its own, closed by `close`)."""

    # -- accepting ------------------------------------------------------------------------------

    def submit(self, items: Sequence[ItemSpec], *, size: Size, policy: PolicyName, max_pending: int,
               owner: str = "", kind: JobKind = JobKind.EVALUATE) -> Submitted:
        """Store a job; raises QueueFull or KeyConflict (nothing is stored then)."""
        if not items:
            raise ValueError("a job needs at least one item")
        size, policy, kind = Size(size), PolicyName(policy), JobKind(kind)
        job_id = uuid.uuid4().hex
        now = time.time()
        rows = [(task_to_json(it.task), it.task.identity_hash, it.candidate, _sha(it.candidate), it.key)
                for it in items]
        with self._write() as db:
            origins: list[tuple[int, int] | None] = []
            for i, (_, task_hash, _, cand_hash, key) in enumerate(rows):
                if key is None:
                    origins.append(None)
                    continue
                found = db.execute(
                    "SELECT i.job_seq, i.idx, i.task, i.candidate_hash, j.size, j.policy, j.kind FROM items i "
                    "JOIN jobs j ON j.seq = i.job_seq WHERE i.owner = ? AND i.key = ? AND i.origin_seq IS NULL",
                    (owner, key)).fetchone()
                if found is None:
                    origins.append(None)
                    continue
                # the stored task's identity (source and size presets, `Task.identity_hash`), from
                # the task it stored: items stored before presets counted carry a source-only task_hash
                stored = (task_from_json(found[2]).identity_hash, *found[3:])
                if tuple(stored) != (task_hash, cand_hash, str(size), str(policy), str(kind)):
                    raise KeyConflict(f"item {i}: key {key!r} was already used for another task, candidate, "
                                      "size or policy")
                origins.append((found[0], found[1]))
            n_eval = sum(o is None for o in origins)
            pending = db.execute("SELECT COALESCE(SUM(n_eval), 0) FROM jobs WHERE state IN ('queued', 'running')"
                                 ).fetchone()[0]
            if n_eval and pending + n_eval > max_pending:
                raise QueueFull(pending, n_eval, max_pending)
            state = JobState.QUEUED if n_eval else JobState.DONE
            cur = db.execute(
                "INSERT INTO jobs (id, kind, owner, state, size, policy, n_items, n_eval, created_s, finished_s) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, str(kind), owner, str(state), str(size), str(policy), len(items), n_eval, now,
                 None if n_eval else now))
            seq = cur.lastrowid
            db.executemany(
                "INSERT INTO items (job_seq, idx, task, task_hash, candidate, candidate_hash, key, origin_seq, "
                "origin_idx, owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(seq, i, t, th, c, ch, k, o[0] if o else None, o[1] if o else None, owner)
                 for i, ((t, th, c, ch, k), o) in enumerate(zip(rows, origins))])
        return Submitted(job_id=job_id, n_items=len(items), reused=len(items) - n_eval, state=state)

    # -- running --------------------------------------------------------------------------------

    def recover(self) -> int:
        """Queue again every job left running by a server that died. Returns how many."""
        with self._write() as db:
            return db.execute("UPDATE jobs SET state = 'queued' WHERE state = 'running'").rowcount

    def claim(self) -> ClaimedJob | None:
        """Take the oldest queued job (it becomes running), or None."""
        with self._write() as db:
            row = db.execute("SELECT seq, id, kind, size, policy, attempts, owner FROM jobs WHERE state = 'queued' "
                             "ORDER BY seq LIMIT 1").fetchone()
            if row is None:
                return None
            seq, job_id, kind, size, policy, attempts, owner = row
            db.execute("UPDATE jobs SET state = 'running', attempts = attempts + 1, started_s = ? WHERE seq = ?",
                       (time.time(), seq))
            items = db.execute("SELECT idx, task, candidate FROM items WHERE job_seq = ? AND origin_seq IS NULL "
                               "ORDER BY idx", (seq,)).fetchall()
        return ClaimedJob(seq=seq, job_id=job_id, kind=JobKind(kind), size=Size(size), policy=PolicyName(policy),
                          attempts=attempts + 1, items=tuple((idx, task_from_json(t), c) for idx, t, c in items),
                          owner=owner)

    def complete(self, seq: int, results: Sequence[tuple[int, EvalResult | ProfileOutcome]]) -> bool:
        """Record a running job's results and mark it done, atomically. False (nothing written)
        when the job is not running (already done). Raises ValueError (nothing written) when a
        result is missing."""
        now = time.time()
        with self._write() as db:
            row = db.execute("SELECT state, n_eval FROM jobs WHERE seq = ?", (seq,)).fetchone()
            if row is None or row[0] != JobState.RUNNING:
                return False
            written = 0
            for idx, res in results:
                status = res.status.value if isinstance(res, EvalResult) else None
                written += db.execute(
                    "UPDATE items SET status = ?, result = ?, finished_s = ? WHERE job_seq = ? AND idx = ? "
                    "AND origin_seq IS NULL AND result IS NULL",
                    (status, json.dumps(res.to_dict()), now, seq, idx)).rowcount
            if written != row[1]:
                raise ValueError(f"job {seq}: {written} results for its {row[1]} items")  # rolled back
            db.execute("UPDATE jobs SET state = 'done', finished_s = ? WHERE seq = ?", (now, seq))
        return True

    def fail(self, seq: int, reason: str) -> bool:
        """End a running job as failed, with the reason, and free its keys (a retry judges again);
        False when it was not running."""
        with self._write() as db:
            if not db.execute("UPDATE jobs SET state = 'failed', error = ?, finished_s = ? WHERE seq = ? "
                              "AND state = 'running'", (reason, time.time(), seq)).rowcount:
                return False
            db.execute("UPDATE items SET key = NULL WHERE job_seq = ? AND origin_seq IS NULL", (seq,))
        return True

    def requeue(self, seq: int) -> bool:
        """Put a running job back in the queue (its backend failed); False if it was not running."""
        with self._write() as db:
            return bool(db.execute("UPDATE jobs SET state = 'queued' WHERE seq = ? AND state = 'running'",
                                   (seq,)).rowcount)

    def purge(self, *, finished_before_s: float) -> int:
        """Remove the jobs finished before this time (and their items), except those whose
        results a kept job reuses and those still waiting on another job. Returns how many."""
        with self._write() as db:
            seqs = [seq for (seq,) in db.execute(
                "SELECT j.seq FROM jobs j WHERE j.state IN ('done', 'failed') AND j.finished_s < ?1 "
                "AND NOT EXISTS (SELECT 1 FROM items r JOIN jobs rj ON rj.seq = r.job_seq WHERE r.origin_seq = j.seq "
                "    AND NOT (rj.state IN ('done', 'failed') AND rj.finished_s < ?1)) "
                "AND NOT EXISTS (SELECT 1 FROM items i JOIN jobs o ON o.seq = i.origin_seq WHERE i.job_seq = j.seq "
                "    AND o.state IN ('queued', 'running'))", (finished_before_s,))]
            db.executemany("DELETE FROM items WHERE job_seq = ?", [(s,) for s in seqs])
            db.executemany("DELETE FROM jobs WHERE seq = ?", [(s,) for s in seqs])
        return len(seqs)

    # -- reading --------------------------------------------------------------------------------

    def _state(self, seq: int, stored: str) -> tuple[JobState, str | None]:
        """A job's state as clients see it, and why it failed: a job whose own items are done but
        which reuses results of other jobs (through keys) is as far as the least advanced of
        those, and failed when one of them failed."""
        if stored != JobState.DONE:
            return JobState(stored), None
        waiting = self._db.execute(
            "SELECT oj.state, oj.error FROM items i JOIN items o ON o.job_seq = i.origin_seq AND o.idx = i.origin_idx "
            "JOIN jobs oj ON oj.seq = i.origin_seq WHERE i.job_seq = ? AND o.result IS NULL", (seq,)).fetchall()
        for state, error in waiting:
            if state == JobState.FAILED:
                return JobState.FAILED, f"an item reuses (by its key) the result of a job that failed: {error}"
        return min((JobState(s) for s, _ in waiting), key=_ORDER.__getitem__, default=JobState.DONE), None

    def state(self, job_id: str, *, owner: str = "") -> JobState | None:
        """A job's state (cheap: no results are read), or None for an unknown job or another owner's."""
        with self._lock:
            row = self._db.execute("SELECT seq, state FROM jobs WHERE id = ? AND owner = ?",
                                   (job_id, owner)).fetchone()
            return None if row is None else self._state(*row)[0]

    def job(self, job_id: str, *, owner: str = "") -> JobView | None:
        """A job and its results, or None for an unknown job or another owner's."""
        with self._lock:
            row = self._db.execute("SELECT seq, kind, state, n_items, attempts, created_s, finished_s, error FROM jobs "
                                   "WHERE id = ? AND owner = ?", (job_id, owner)).fetchone()
            if row is None:
                return None
            seq, kind, state, n_items, attempts, created_s, finished_s, error = row
            view_state, reuse_error = self._state(seq, state)
            items = self._db.execute(
                "SELECT COALESCE(o.result, i.result) FROM items i "
                "LEFT JOIN items o ON o.job_seq = i.origin_seq AND o.idx = i.origin_idx "
                "WHERE i.job_seq = ? ORDER BY i.idx", (seq,)).fetchall()
        results = [json.loads(r) if r is not None else None for (r,) in items]
        return JobView(job_id=job_id, kind=JobKind(kind), state=view_state, n_items=n_items, results=results,
                       attempts=attempts, created_s=created_s,
                       finished_s=finished_s if view_state in FINISHED else None, error=error or reuse_error)

    def pending_items(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COALESCE(SUM(n_eval), 0) FROM jobs "
                                        "WHERE state IN ('queued', 'running')").fetchone()[0])

    def stats(self, *, since: float) -> StoreStats:
        with self._lock:
            jobs = dict(self._db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())
            pending = dict(self._db.execute("SELECT state, COALESCE(SUM(n_eval), 0) FROM jobs "
                                            "WHERE state IN ('queued', 'running') GROUP BY state").fetchall())
            by_status = dict(self._db.execute("SELECT status, COUNT(*) FROM items WHERE status IS NOT NULL "
                                              "GROUP BY status").fetchall())
            recent = self._db.execute("SELECT COUNT(*) FROM items WHERE finished_s >= ? AND status IS NOT NULL",
                                      (since,)).fetchone()[0]
        return StoreStats(jobs={s: int(jobs.get(str(s), 0)) for s in JobState},
                          pending_items={s: int(pending.get(str(s), 0)) for s in (JobState.QUEUED, JobState.RUNNING)},
                          by_status={str(k): int(v) for k, v in by_status.items()}, finished_since=int(recent))
