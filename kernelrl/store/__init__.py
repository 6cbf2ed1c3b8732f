"""The run database: every task, candidate, answer, verdict, refused hack and training step of every run.

This package is the only code that knows the run database's tables and SQL: `schema` (tables and
their versions; connections, transactions and migrations are `kernelrl.sqlite`'s), this module's
`Database` (the writer, and the reads of the search, the trainer and the report), `steps` (the
training step log's table) and `snapshot` (the watch pages' read-only reads of a file another
process is writing).

Storage is one SQLite file in WAL mode. One `Database` object is the single writer of a file: its
methods serialise on a lock, so threads may share it, and every write is one committed
transaction. A process killed with SIGKILL at any point therefore leaves the file holding every
write that returned, and no half rows: a candidate is first written as `proposed` (source,
prompt, raw answer, token counts), and later its result, its findings and its state change to
`evaluated` land together in one transaction.

Guarantees:
- results are stored in full (`EvalResult.to_dict` JSON), with status, speedup and times also as
  columns for queries; `CandidateRecord.result` is the typed `EvalResult`;
- `find_verdict` is the dedup lookup behind `kernelrl.judge.reuse.judged_before` (its key and its
  rule): a source already evaluated for a task (with the same task source, in the key and in the
  task table) under the same evaluator config (its fingerprint: device, size, policy, tolerances,
  correctness sets, timing, limits) has its stored result reused (`store_reused_result`)
  instead of a second evaluation; a result judged under any other setting is not reused;
- an answer without code is stored with a `no_code` result (`EvalResult.no_code`); rows older
  versions stored for one say `compile_error` in the `status` column and read back as `no_code`
  through `EvalResult.from_dict`;
- every refused (flagged) program is kept in the hack-case table with each rule that refused it,
  whatever refused it (static rule, dynamic defence, degenerate task, LLM judge), so prompts and
  trainers can show what not to do (`hack_cases`, `recent_refused`);
- the schema carries a version (`schema.SCHEMA`, migrated by `kernelrl.sqlite`); a file written
  by a newer schema is refused with a clear error, and an older one is brought up to date when
  opened for writing, step by step (a failed step leaves it whole at the version before); opened
  read-only, an older one is refused too (a reader never writes);
- the training step log (`log_step`, `train_steps`) is written through the same connection and
  lock, one transaction per step.

Does not guarantee: safety with two processes writing one file at once (SQLite serialises them,
but the search loop assumes it is the only writer of its run), nor durability against power loss
beyond what SQLite's `synchronous=NORMAL` in WAL mode gives (committed transactions survive a
process crash, the case that matters here).
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelrl.judge.reuse import JudgedKey, Known
from kernelrl.result import EvalResult, Severity, Status
from kernelrl.sqlite import (
    SchemaError,
    check_version,
    connect_reader,
    connect_writer,
    migrate,
    stored_version,
    transaction,
)
from kernelrl.store import steps
from kernelrl.store.records import (
    BaselineRecord,
    CandidateRecord,
    CandidateState,
    ContrastDraw,
    FindingRecord,
    HackCase,
    NewCandidate,
    RunMeta,
    RunRecord,
    RunStatus,
    TaskRecord,
)
from kernelrl.store.schema import SCHEMA, DatabaseError
from kernelrl.store.schema import SCHEMA_VERSION as SCHEMA_VERSION  # the version a file is brought to

if TYPE_CHECKING:
    from kernelrl.tasks.task import Task

# A weaker candidate is shown for contrast only when the best is at least this many times faster:
# close scores are timing noise, not a lesson.
CONTRAST_RATIO = 1.2

_CAND_COLS = ("c.id, c.run_id, c.task, c.hash, c.source, c.parents, c.chain, c.step, c.proposer, c.prompt, "
              "c.answer, c.prompt_tokens, c.completion_tokens, c.created, c.state, c.meta, r.result")
_CAND_FROM = "candidates c LEFT JOIN results r ON r.candidate_id = c.id"


class Database:
    """A kernelrl code database file. Use as a context manager or call `close()`."""

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        if readonly and not self.path.exists():
            raise DatabaseError(f"no database at {self.path}")
        if not readonly:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # candidates, prompts and answers: a new database is its owner's alone (0600; SQLite
            # gives its WAL and shared-memory files the same mode). An existing one keeps its mode.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            # Several processes (a run's ranks) may open a new file at once: switching it to WAL and
            # creating the schema need it alone, and SQLite answers "database is locked" at once to
            # the others instead of waiting. An flock held while opening makes them take turns (it
            # is independent of SQLite's own locks, and the kernel drops it if the process dies).
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._open(readonly=False)
            finally:
                os.close(fd)  # releases the flock
            return
        self._open(readonly=True)

    def _open(self, *, readonly: bool) -> None:
        try:
            self._conn = connect_reader(self.path) if readonly else connect_writer(self.path)
        except sqlite3.DatabaseError as e:
            raise DatabaseError(f"{self.path}: not a usable SQLite database ({e})") from e
        self._lock = threading.RLock()
        self._check_schema()

    # ----------------------------------------------------------------- plumbing
    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction: all of it is committed, or none of it."""
        if self.readonly:
            raise DatabaseError(f"{self.path} is open read-only")
        return transaction(self._conn, self._lock)

    # Rows stay `Any`: sqlite3 types a fetched row so, and each reader knows its columns' types.
    def _query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def _check_schema(self) -> None:
        """A writer brings the file to `SCHEMA_VERSION` (`kernelrl.sqlite.migrate`); a reader takes
        it only at that version (`kernelrl.sqlite.check_version`: run a writer on an older file)."""
        try:
            if self.readonly:
                with self._lock:
                    check_version(self._conn, SCHEMA)
            else:
                migrate(self._conn, SCHEMA, self._lock)
        except SchemaError as e:
            raise DatabaseError(str(e)) from None
        except sqlite3.DatabaseError as e:
            raise DatabaseError(f"{self.path}: not a usable SQLite database ({e})") from e

    @property
    def schema_version(self) -> int:
        with self._lock:
            return stored_version(self._conn, SCHEMA)

    @property
    def journal_mode(self) -> str:
        return str(self._query("PRAGMA journal_mode")[0][0]).lower()

    # ----------------------------------------------------------------- runs
    def start_run(self, config: Mapping[str, object]) -> int:
        with self._tx() as c:
            cur = c.execute("INSERT INTO runs (config, started, status) VALUES (?, ?, ?)",
                            (json.dumps(config, sort_keys=True, default=str), time.time(), RunStatus.RUNNING.value))
            return int(cur.lastrowid or 0)

    def finish_run(self, run_id: int, status: RunStatus) -> None:
        with self._tx() as c:
            c.execute("UPDATE runs SET status = ?, finished = ? WHERE id = ?", (status.value, time.time(), run_id))

    def reopen_run(self, run_id: int, config: Mapping[str, object]) -> None:
        """Mark a run as running again (resume), with the config it now continues under."""
        with self._tx() as c:
            c.execute("UPDATE runs SET status = ?, finished = NULL, config = ? WHERE id = ?",
                      (RunStatus.RUNNING.value, json.dumps(config, sort_keys=True, default=str), run_id))

    def runs(self) -> list[RunRecord]:
        return [_run(r) for r in self._query("SELECT id, config, started, finished, status FROM runs ORDER BY id")]

    def get_run(self, run_id: int) -> RunRecord | None:
        rows = self._query("SELECT id, config, started, finished, status FROM runs WHERE id = ?", (run_id,))
        return _run(rows[0]) if rows else None

    def latest_run(self) -> RunRecord | None:
        rows = self._query("SELECT id, config, started, finished, status FROM runs ORDER BY id DESC LIMIT 1")
        return _run(rows[0]) if rows else None

    # ----------------------------------------------------------------- training step log
    def log_step(self, record: steps.StepRecord) -> None:
        """Store one logging step of a training run (`steps.write`), in one transaction."""
        with self._tx() as c:
            steps.write(c, record)

    def train_steps(self, run_id: int) -> list[steps.StepRecord]:
        """A run's logged training steps in order (none when nothing was logged)."""
        with self._lock:
            return steps.read(self._conn, run_id)

    # ----------------------------------------------------------------- tasks and baselines
    def register_task(self, task: Task, *, size: str) -> None:
        """The task's row, under the hash its verdicts are stored against (`Task.identity_hash`: the
        source and its size presets): what every caller holding a task uses."""
        self.upsert_task(name=task.name, source=task.source, identity_hash=task.identity_hash, level=task.level,
                         size=size)

    def upsert_task(self, *, name: str, source: str, identity_hash: str, level: int | None, size: str) -> None:
        """A task row as given (`identity_hash`: `Task.identity_hash`, what verdicts are stored
        against): for rows made by hand, such as a test's edge cases; a caller with a `Task` uses
        `register_task`, which cannot pass another hash."""
        with self._tx() as c:
            c.execute("INSERT INTO tasks (name, source, identity_hash, level, size) VALUES (?, ?, ?, ?, ?) "
                      "ON CONFLICT(name) DO UPDATE SET source=excluded.source, identity_hash=excluded.identity_hash, "
                      "level=excluded.level, size=excluded.size", (name, source, identity_hash, level, size))

    def tasks(self) -> list[TaskRecord]:
        return [TaskRecord(name=r[0], source=r[1], identity_hash=r[2], level=r[3], size=r[4])
                for r in self._query("SELECT name, source, identity_hash, level, size FROM tasks ORDER BY name")]

    def put_baseline(self, *, task: str, device: str, size: str, eager_ms: float, compile_ms: float | None,
                     compile_ci: tuple[float, float] | None = None) -> None:
        if not eager_ms > 0:
            raise ValueError(f"eager_ms must be > 0, got {eager_ms}")
        if compile_ms is not None and not compile_ms > 0:
            raise ValueError(f"compile_ms must be > 0 or None, got {compile_ms}")
        with self._tx() as c:
            lo, hi = compile_ci if compile_ci is not None and compile_ms is not None else (None, None)
            c.execute("INSERT OR REPLACE INTO baselines (task, device, size, eager_ms, compile_ms, measured, "
                      "compile_ci_lo, compile_ci_hi) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                      (task, device, size, eager_ms, compile_ms, time.time(), lo, hi))

    def get_baseline(self, task: str, device: str, size: str) -> BaselineRecord | None:
        rows = self._query("SELECT task, device, size, eager_ms, compile_ms, measured, compile_ci_lo, compile_ci_hi "
                           "FROM baselines WHERE task = ? AND device = ? AND size = ?", (task, device, size))
        return _baseline(rows[0]) if rows else None

    def baselines(self) -> list[BaselineRecord]:
        return [_baseline(r) for r in self._query(
            "SELECT task, device, size, eager_ms, compile_ms, measured, compile_ci_lo, compile_ci_hi FROM baselines "
            "ORDER BY task")]

    # ----------------------------------------------------------------- candidates and results
    def add_candidate(self, new: NewCandidate) -> CandidateRecord:
        """Store a proposal (state `proposed`) in one transaction and return its record."""
        created = time.time()
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO candidates (run_id, task, hash, source, parents, chain, step, proposer, prompt, answer, "
                "prompt_tokens, completion_tokens, created, state, meta) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (new.run_id, new.task, new.hash, new.source, json.dumps(list(new.parents)), new.chain, new.step,
                 new.proposer, new.prompt, new.answer, new.prompt_tokens, new.completion_tokens, created,
                 CandidateState.PROPOSED.value, json.dumps(new.meta.to_dict(), default=str)))
            cid = int(cur.lastrowid or 0)
        return CandidateRecord(id=cid, run_id=new.run_id, task=new.task, hash=new.hash, source=new.source,
                               parents=tuple(new.parents), chain=new.chain, step=new.step, proposer=new.proposer,
                               prompt=new.prompt, answer=new.answer, prompt_tokens=new.prompt_tokens,
                               completion_tokens=new.completion_tokens, created=created,
                               state=CandidateState.PROPOSED, meta=new.meta)

    def merge_meta(self, candidate_id: int, meta: RunMeta) -> None:
        """Add to a candidate's meta what training learned of it later (a multi-turn turn's return,
        once its episode has ended): every field `meta` sets replaces the stored one."""
        with self._tx() as c:
            rows = c.execute("SELECT meta FROM candidates WHERE id = ?", (candidate_id,)).fetchall()
            if not rows:
                raise DatabaseError(f"no candidate {candidate_id}")
            stored = RunMeta.from_dict(json.loads(rows[0][0] or "{}"))
            c.execute("UPDATE candidates SET meta = ? WHERE id = ?",
                      (json.dumps(stored.merged(meta).to_dict(), default=str), candidate_id))

    def store_result(self, candidate_id: int, result: EvalResult, *, reused_from: int | None = None) -> None:
        """Result, findings and the state change of one candidate, in one transaction."""
        with self._tx() as c:
            cand = c.execute("SELECT task, hash, state FROM candidates WHERE id = ?", (candidate_id,)).fetchall()
            if not cand:
                raise DatabaseError(f"no candidate {candidate_id}")
            task, h, state = cand[0]
            if state == CandidateState.EVALUATED.value:
                raise DatabaseError(f"candidate {candidate_id} already has a result")
            # task_hash: the task's source when this was judged; a changed task file is a new task
            # for dedup purposes
            c.execute("INSERT INTO results (candidate_id, task, hash, status, speedup, cand_ms, ref_ms, device, size, "
                      "policy, result, evaluated, reused_from, fingerprint, task_hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,"
                      "COALESCE((SELECT identity_hash FROM tasks WHERE name = ?), ''))",
                      (candidate_id, task, h, result.status.value, result.speedup,
                       result.cand_time.median_ms if result.cand_time else None,
                       result.ref_time.median_ms if result.ref_time else None,
                       result.device, result.size, result.policy, json.dumps(result.to_dict(), default=str),
                       time.time(), reused_from, result.config_fingerprint, task))
            c.executemany("INSERT INTO findings (candidate_id, rule, severity, stage, message) VALUES (?,?,?,?,?)",
                          [(candidate_id, f.rule, f.severity.value, f.stage, f.message) for f in result.findings])
            if result.status is Status.FLAGGED and reused_from is None:
                # Every refused program is a hack case, whatever refused it (static rule, dynamic
                # defence, degenerate task, LLM judge): prompts and trainers show them.
                c.executemany("INSERT OR IGNORE INTO hack_cases (candidate_id, task, hash, rule, stage, message, "
                              "line, created) VALUES (?,?,?,?,?,?,?,?)",
                              [(candidate_id, task, h, f.rule, f.stage, f.message, f.line, time.time())
                               for f in result.findings if f.severity is Severity.REJECT])
            c.execute("UPDATE candidates SET state = ? WHERE id = ?", (CandidateState.EVALUATED.value, candidate_id))

    def find_result(self, task: str, source_hash: str, *, fingerprint: str,
                    task_hash: str | None = None) -> tuple[int, EvalResult] | None:
        """The stored evaluation of this source for this task, judged under the evaluator config
        whose fingerprint is given (device, size, policy, tolerances, correctness sets, timing...):
        (candidate id, result). Callers deciding whether to reuse it ask `find_verdict` through
        `kernelrl.judge.reuse.judged_before`, which applies the reuse rule.

        Only results judged against the task's current source count (see `upsert_task`), and,
        given `task_hash`, against that source too; a result stored without a fingerprint is
        never reused.
        """
        if not fingerprint:
            return None
        also, extra = ("AND task_hash = ? ", (task_hash,)) if task_hash is not None else ("", ())
        rows = self._query("SELECT candidate_id, result FROM results WHERE task = ? AND hash = ? AND fingerprint = ? "
                           "AND reused_from IS NULL AND status != 'judge_error' "
                           "AND task_hash = COALESCE((SELECT identity_hash FROM tasks WHERE name = ?), '') "
                           f"{also}ORDER BY candidate_id LIMIT 1", (task, source_hash, fingerprint, task, *extra))
        if not rows:
            return None
        return int(rows[0][0]), EvalResult.from_dict(json.loads(rows[0][1]))

    def find_verdict(self, key: JudgedKey) -> Known | None:
        """The first stored evaluation for `key` (a `kernelrl.judge.reuse.VerdictStore`)."""
        hit = self.find_result(key.task, key.source_hash, fingerprint=key.fingerprint, task_hash=key.task_hash)
        return Known(result=hit[1], candidate_id=hit[0]) if hit is not None else None

    def store_reused_result(self, candidate_id: int, original_id: int, result: EvalResult) -> None:
        self.store_result(candidate_id, result, reused_from=original_id)

    def get_candidate(self, candidate_id: int) -> CandidateRecord | None:
        rows = self._query(f"SELECT {_CAND_COLS} FROM {_CAND_FROM} WHERE c.id = ?", (candidate_id,))
        return _candidate(rows[0]) if rows else None

    def candidates(self, *, task: str | None = None, run_id: int | None = None,
                   state: CandidateState | None = None) -> list[CandidateRecord]:
        """Candidates in creation order, filtered by task, run and state."""
        where, params = _where(task=task, run_id=run_id, state=state)
        return [_candidate(r) for r in self._query(f"SELECT {_CAND_COLS} FROM {_CAND_FROM}{where} ORDER BY c.id",
                                                   params)]

    def pending_candidates(self, run_id: int | None = None) -> list[CandidateRecord]:
        """Proposed but not evaluated: what a resumed run evaluates before asking the model again."""
        return self.candidates(run_id=run_id, state=CandidateState.PROPOSED)

    def count_candidates(self, *, task: str | None = None, run_id: int | None = None) -> int:
        where, params = _where(task=task, run_id=run_id, state=None)
        return int(self._query(f"SELECT COUNT(*) FROM candidates c{where}", params)[0][0])

    def token_totals(self, run_id: int | None = None) -> tuple[int, int]:
        """(prompt tokens, completion tokens) over a run, or over the whole file."""
        where, params = _where(task=None, run_id=run_id, state=None)
        row = self._query(f"SELECT COALESCE(SUM(prompt_tokens),0), COALESCE(SUM(completion_tokens),0) "
                          f"FROM candidates c{where}", params)[0]
        return int(row[0]), int(row[1])

    def findings(self, *, rule: str | None = None) -> list[FindingRecord]:
        sql = "SELECT candidate_id, rule, severity, stage, message FROM findings"
        params: tuple[str, ...] = ()
        if rule is not None:
            sql += " WHERE rule = ?"
            params = (rule,)
        return [FindingRecord(candidate_id=r[0], rule=r[1], severity=Severity(r[2]), stage=r[3], message=r[4])
                for r in self._query(sql + " ORDER BY id", params)]

    # ----------------------------------------------------------------- queries for prompts
    def top_candidates(self, task: str, k: int) -> list[CandidateRecord]:
        """The k fastest correct candidates of a task, fastest first, one per distinct source."""
        if k <= 0:
            return []
        return self._correct_distinct(task)[:k]

    def contrast_set(self, task: str, k: int, rng: random.Random | None = None, *,
                     draw: ContrastDraw = ContrastDraw.BEST, temperature: float = 1.0) -> list[CandidateRecord]:
        """Up to k correct candidates chosen for contrast, fastest first.

        `ContrastDraw.BEST`: the best one, then candidates clearly weaker than it (at most
        best/CONTRAST_RATIO), drawn by `rng` one from each of k-1 equal slices of the weaker ones
        ranked by speed, so the set spans the range of speeds rather than bunching at one end.
        When there are too few clearly weaker ones, the next fastest fill the set.
        `ContrastDraw.SCORE`: k drawn by `rng` without replacement, each with weight
        speedup ** (1 / temperature) (lower temperature: the fast ones more often).
        Refused candidates are not in this set: ask `recent_refused` for them.
        """
        if k <= 0:
            return []
        if temperature <= 0:
            raise ValueError("contrast temperature must be > 0")
        rng = rng or random.Random(0)
        ranked = self._correct_distinct(task)
        if not ranked:
            return []
        if draw is ContrastDraw.SCORE:
            pool = list(ranked)
            drawn: list[CandidateRecord] = []
            while pool and len(drawn) < k:
                weights = [max(c.speedup or 0.0, 1e-3) ** (1.0 / temperature) for c in pool]
                drawn.append(pool.pop(rng.choices(range(len(pool)), weights=weights)[0]))
            return sorted(drawn, key=lambda c: -(c.speedup or 0.0))
        best = ranked[0]
        limit = (best.speedup or 0.0) / CONTRAST_RATIO
        weaker = [c for c in ranked[1:] if (c.speedup or 0.0) <= limit]
        picked: list[CandidateRecord] = [best]
        slots = k - 1
        if slots > 0 and weaker:
            n = min(slots, len(weaker))
            for i in range(n):
                lo, hi = i * len(weaker) // n, (i + 1) * len(weaker) // n
                picked.append(weaker[rng.randrange(lo, hi)])
        if len(picked) < k:
            chosen = {c.id for c in picked}
            picked.extend([c for c in ranked if c.id not in chosen][: k - len(picked)])
        return sorted(picked, key=lambda c: -(c.speedup or 0.0))

    def recent_refused(self, task: str, n: int) -> list[CandidateRecord]:
        """The n most recent refused programs of a task (hack cases, one per source), newest first.

        Each record's `result.findings` / `result.rejecting_rules` name the rules that refused it.
        """
        if n <= 0:
            return []
        ids = [r[0] for r in self._query("SELECT candidate_id FROM hack_cases WHERE task = ? "
                                         "GROUP BY hash ORDER BY MAX(id) DESC LIMIT ?", (task, n))]
        recs = [self.get_candidate(i) for i in ids]
        return [r for r in recs if r is not None]

    def hack_cases(self, *, task: str | None = None, limit: int | None = None) -> list[HackCase]:
        """Refused programs with the rule that refused each, newest first (one row per rule)."""
        params: list[str | int] = [task] if task is not None else []
        where = " WHERE h.task = ?" if task is not None else ""
        sql = ("SELECT h.candidate_id, h.task, h.hash, h.rule, h.stage, h.message, h.line, h.created, c.source "
               f"FROM hack_cases h JOIN candidates c ON c.id = h.candidate_id{where} ORDER BY h.id DESC")
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        return [HackCase(candidate_id=r[0], task=r[1], hash=r[2], rule=r[3], stage=r[4], message=r[5], line=r[6],
                         created=r[7], source=r[8]) for r in self._query(sql, params)]

    def hack_case_counts(self) -> dict[str, int]:
        """Refused programs per rule."""
        return {r[0]: int(r[1]) for r in self._query("SELECT rule, COUNT(*) FROM hack_cases GROUP BY rule "
                                                     "ORDER BY COUNT(*) DESC, rule")}

    def recent_with_status(self, task: str, n: int, statuses: Sequence[Status]) -> list[CandidateRecord]:
        """The n most recent candidates of a task with one of `statuses`, one per source, newest first."""
        if n <= 0 or not statuses:
            return []
        marks = ",".join("?" * len(statuses))
        rows = self._query(f"SELECT {_CAND_COLS} FROM {_CAND_FROM} WHERE c.task = ? AND r.status IN ({marks}) "
                           f"ORDER BY c.id DESC", (task, *[s.value for s in statuses]))
        out: list[CandidateRecord] = []
        seen: set[str] = set()
        for r in rows:
            rec = _candidate(r)
            if rec.hash in seen:
                continue
            seen.add(rec.hash)
            out.append(rec)
            if len(out) == n:
                break
        return out

    def _correct_distinct(self, task: str) -> list[CandidateRecord]:
        rows = self._query(f"SELECT {_CAND_COLS} FROM {_CAND_FROM} WHERE c.task = ? AND r.status = ? "
                           f"ORDER BY r.speedup DESC, c.id ASC", (task, Status.CORRECT.value))
        out: list[CandidateRecord] = []
        seen: set[str] = set()
        for r in rows:
            rec = _candidate(r)
            if rec.hash not in seen:
                seen.add(rec.hash)
                out.append(rec)
        return out


def _where(*, task: str | None, run_id: int | None, state: CandidateState | None) -> tuple[str, tuple[str | int, ...]]:
    clauses: list[str] = []
    params: list[str | int] = []
    if task is not None:
        clauses.append("c.task = ?")
        params.append(task)
    if run_id is not None:
        clauses.append("c.run_id = ?")
        params.append(run_id)
    if state is not None:
        clauses.append("c.state = ?")
        params.append(state.value)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)


def _run(r: tuple[Any, ...]) -> RunRecord:
    return RunRecord(id=r[0], config=json.loads(r[1]), started=r[2], finished=r[3], status=RunStatus(r[4]))


def _baseline(r: tuple[Any, ...]) -> BaselineRecord:
    ci = (float(r[6]), float(r[7])) if r[6] is not None and r[7] is not None else None
    return BaselineRecord(task=r[0], device=r[1], size=r[2], eager_ms=r[3], compile_ms=r[4], measured=r[5],
                          compile_ci=ci)


def _candidate(r: tuple[Any, ...]) -> CandidateRecord:
    return CandidateRecord(id=r[0], run_id=r[1], task=r[2], hash=r[3], source=r[4], parents=tuple(json.loads(r[5])),
                           chain=r[6], step=r[7], proposer=r[8], prompt=r[9], answer=r[10], prompt_tokens=r[11],
                           completion_tokens=r[12], created=r[13], state=CandidateState(r[14]),
                           meta=RunMeta.from_dict(json.loads(r[15])),
                           result=EvalResult.from_dict(json.loads(r[16])) if r[16] is not None else None)


def open_database(path: str | Path, *, readonly: bool = False) -> Database:
    return Database(path, readonly=readonly)
