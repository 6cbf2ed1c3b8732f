"""The job store: every accepted job, its items, idempotency keys and results, in SQLite.

Guarantees:
- a job is written (WAL, `synchronous=FULL`) before the server answers 202, so an accepted job
  survives a SIGKILL of the server, and a power cut;
- a job completes exactly once: `complete` records all of its results and marks it done in one
  transaction, and only if it is still running; a job that was running when the server died is
  queued again by `recover` at the next start and evaluated again from scratch (evaluation is
  at-least-once, completion exactly once); after `max_attempts` starts it is closed with
  task_error results instead of being retried forever;
- an idempotency key names one evaluation for ever: an item whose key is already stored is not
  evaluated again, its result is the stored item's (the first result); the same key with another
  task, candidate, size or policy is refused (`KeyConflict`);
- the queue is bounded: `submit` refuses (`QueueFull`) a job whose new evaluations would take
  the evaluations queued or running past the limit; items answered from keys cost nothing.

Does not run anything and does not parse task code beyond what the caller gives it; it is safe
to call from several threads (one connection, one lock). One server per database file: the
server holds a lock file beside it (`kernelrl.serve.server`), since `recover` would otherwise
queue again jobs that another live server is running.
"""

from __future__ import annotations

import enum
import hashlib
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelrl.checks.policy import PolicyName
from kernelrl.result import EvalResult
from kernelrl.tasks.task import Size, Task

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done')),
    size TEXT NOT NULL,
    policy TEXT NOT NULL,
    n_items INTEGER NOT NULL,
    n_eval INTEGER NOT NULL,  -- items this job evaluates itself (the others are answered from keys)
    attempts INTEGER NOT NULL DEFAULT 0,
    created_s REAL NOT NULL,
    started_s REAL,
    finished_s REAL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state, seq);
CREATE TABLE IF NOT EXISTS items (
    job_seq INTEGER NOT NULL REFERENCES jobs (seq),
    idx INTEGER NOT NULL,
    task TEXT NOT NULL,  -- JSON: name, source, level, suite, presets
    task_hash TEXT NOT NULL,
    candidate TEXT NOT NULL,
    candidate_hash TEXT NOT NULL,
    key TEXT,
    origin_seq INTEGER,  -- set when the key was already stored: that item holds the result
    origin_idx INTEGER,
    status TEXT,
    result TEXT,  -- JSON: EvalResult.to_dict()
    finished_s REAL,
    PRIMARY KEY (job_seq, idx)
);
CREATE UNIQUE INDEX IF NOT EXISTS items_key ON items (key) WHERE key IS NOT NULL AND origin_seq IS NULL;
CREATE INDEX IF NOT EXISTS items_status ON items (status);
CREATE INDEX IF NOT EXISTS items_finished ON items (finished_s);
"""


class JobState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


_ORDER = {JobState.QUEUED: 0, JobState.RUNNING: 1, JobState.DONE: 2}


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
    """One evaluation asked for: a task (already resolved, never executed), a candidate source,
    and an optional idempotency key."""

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
    size: Size
    policy: PolicyName
    attempts: int  # including this one
    items: tuple[tuple[int, Task, str], ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class JobView:
    job_id: str
    state: JobState
    n_items: int
    results: list[dict[str, Any] | None]  # EvalResult.to_dict() per item, None while pending
    attempts: int
    created_s: float
    finished_s: float | None


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


class JobStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # autocommit mode: transactions are explicit (BEGIN IMMEDIATE ... COMMIT) below
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # -- accepting ------------------------------------------------------------------------------

    def submit(self, items: Sequence[ItemSpec], *, size: Size, policy: PolicyName, max_pending: int) -> Submitted:
        """Store a job; raises QueueFull or KeyConflict (nothing is stored then)."""
        if not items:
            raise ValueError("a job needs at least one item")
        size, policy = Size(size), PolicyName(policy)
        job_id = uuid.uuid4().hex
        now = time.time()
        rows = [(task_to_json(it.task), _sha(it.task.source), it.candidate, _sha(it.candidate), it.key)
                for it in items]
        with self._write() as db:
            origins: list[tuple[int, int] | None] = []
            for i, (_, task_hash, _, cand_hash, key) in enumerate(rows):
                if key is None:
                    origins.append(None)
                    continue
                found = db.execute(
                    "SELECT i.job_seq, i.idx, i.task_hash, i.candidate_hash, j.size, j.policy FROM items i "
                    "JOIN jobs j ON j.seq = i.job_seq WHERE i.key = ? AND i.origin_seq IS NULL", (key,)).fetchone()
                if found is None:
                    origins.append(None)
                    continue
                if (found[2], found[3], found[4], found[5]) != (task_hash, cand_hash, str(size), str(policy)):
                    raise KeyConflict(f"item {i}: key {key!r} was already used for another task, candidate, "
                                      "size or policy")
                origins.append((found[0], found[1]))
            n_eval = sum(o is None for o in origins)
            pending = db.execute("SELECT COALESCE(SUM(n_eval), 0) FROM jobs WHERE state != 'done'").fetchone()[0]
            if n_eval and pending + n_eval > max_pending:
                raise QueueFull(pending, n_eval, max_pending)
            state = JobState.QUEUED if n_eval else JobState.DONE
            cur = db.execute(
                "INSERT INTO jobs (id, state, size, policy, n_items, n_eval, created_s, finished_s) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, str(state), str(size), str(policy), len(items), n_eval, now, None if n_eval else now))
            seq = cur.lastrowid
            db.executemany(
                "INSERT INTO items (job_seq, idx, task, task_hash, candidate, candidate_hash, key, origin_seq, "
                "origin_idx) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(seq, i, t, th, c, ch, k, o[0] if o else None, o[1] if o else None)
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
            row = db.execute("SELECT seq, id, size, policy, attempts FROM jobs WHERE state = 'queued' "
                             "ORDER BY seq LIMIT 1").fetchone()
            if row is None:
                return None
            seq, job_id, size, policy, attempts = row
            db.execute("UPDATE jobs SET state = 'running', attempts = attempts + 1, started_s = ? WHERE seq = ?",
                       (time.time(), seq))
            items = db.execute("SELECT idx, task, candidate FROM items WHERE job_seq = ? AND origin_seq IS NULL "
                               "ORDER BY idx", (seq,)).fetchall()
        return ClaimedJob(seq=seq, job_id=job_id, size=Size(size), policy=PolicyName(policy), attempts=attempts + 1,
                          items=tuple((idx, task_from_json(t), c) for idx, t, c in items))

    def complete(self, seq: int, results: Sequence[tuple[int, EvalResult]]) -> bool:
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
                written += db.execute(
                    "UPDATE items SET status = ?, result = ?, finished_s = ? WHERE job_seq = ? AND idx = ? "
                    "AND origin_seq IS NULL AND result IS NULL",
                    (res.status.value, json.dumps(res.to_dict()), now, seq, idx)).rowcount
            if written != row[1]:
                raise ValueError(f"job {seq}: {written} results for its {row[1]} items")  # rolled back
            db.execute("UPDATE jobs SET state = 'done', finished_s = ? WHERE seq = ?", (now, seq))
        return True

    def requeue(self, seq: int) -> bool:
        """Put a running job back in the queue (its backend failed); False if it was not running."""
        with self._write() as db:
            return bool(db.execute("UPDATE jobs SET state = 'queued' WHERE seq = ? AND state = 'running'",
                                   (seq,)).rowcount)

    # -- reading --------------------------------------------------------------------------------

    def _state(self, seq: int, stored: str) -> JobState:
        """A job's state as clients see it: a job whose own items are done but which reuses
        results of jobs still pending (through keys) is as far as the least advanced of those."""
        if stored != JobState.DONE:
            return JobState(stored)
        waiting = self._db.execute(
            "SELECT oj.state FROM items i JOIN items o ON o.job_seq = i.origin_seq AND o.idx = i.origin_idx "
            "JOIN jobs oj ON oj.seq = i.origin_seq WHERE i.job_seq = ? AND o.result IS NULL", (seq,)).fetchall()
        return min((JobState(s) for (s,) in waiting), key=_ORDER.__getitem__, default=JobState.DONE)

    def state(self, job_id: str) -> JobState | None:
        """A job's state (cheap: no results are read), or None for an unknown job."""
        with self._lock:
            row = self._db.execute("SELECT seq, state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            return None if row is None else self._state(*row)

    def job(self, job_id: str) -> JobView | None:
        with self._lock:
            row = self._db.execute("SELECT seq, state, n_items, attempts, created_s, finished_s FROM jobs "
                                   "WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                return None
            seq, state, n_items, attempts, created_s, finished_s = row
            view_state = self._state(seq, state)
            items = self._db.execute(
                "SELECT COALESCE(o.result, i.result) FROM items i "
                "LEFT JOIN items o ON o.job_seq = i.origin_seq AND o.idx = i.origin_idx "
                "WHERE i.job_seq = ? ORDER BY i.idx", (seq,)).fetchall()
        results = [json.loads(r) if r is not None else None for (r,) in items]
        return JobView(job_id=job_id, state=view_state, n_items=n_items, results=results, attempts=attempts,
                       created_s=created_s, finished_s=finished_s if view_state is JobState.DONE else None)

    def pending_items(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COALESCE(SUM(n_eval), 0) FROM jobs WHERE state != 'done'").fetchone()[0]

    def stats(self, *, since: float) -> StoreStats:
        with self._lock:
            jobs = dict(self._db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())
            pending = dict(self._db.execute("SELECT state, COALESCE(SUM(n_eval), 0) FROM jobs WHERE state != 'done' "
                                            "GROUP BY state").fetchall())
            by_status = dict(self._db.execute("SELECT status, COUNT(*) FROM items WHERE status IS NOT NULL "
                                              "GROUP BY status").fetchall())
            recent = self._db.execute("SELECT COUNT(*) FROM items WHERE finished_s >= ?", (since,)).fetchone()[0]
        return StoreStats(jobs={s: int(jobs.get(str(s), 0)) for s in JobState},
                          pending_items={s: int(pending.get(str(s), 0)) for s in (JobState.QUEUED, JobState.RUNNING)},
                          by_status={str(k): int(v) for k, v in by_status.items()}, finished_since=int(recent))
