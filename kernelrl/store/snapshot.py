"""Read-only reads of a run database that another process may be writing: the watch pages' queries.

`snapshot(path)` opens the file read-only (SQLite's `mode=ro`: this process can never write it)
and yields a `Snapshot` holding one read transaction (`kernelrl.sqlite.transaction(readonly=True)`)
while the page's queries run: in WAL mode the writer goes on committing, and every query of one
request sees the same consistent state of the file. Each request opens its own connection, so
the web server's threads share nothing.

The queries select only the columns a page needs (prompts and answers, the largest columns,
are read for one candidate at a time) and return typed records.

Guarantees: nothing here writes; a missing file, and a file below this kernelrl's schema version
(`kernelrl.sqlite.check_version`: nothing yet, or a file a writer is creating or upgrading step by
step), is `NoDatabase` (a run that has not started yet: the page waits, and says the version); a
file that is not a kernelrl database or has a newer schema is `SnapshotError` with a reason for a
person. A file written before versions moved to `user_version` reads as its `schema_version`
table says (`schema.SCHEMA`).

Does not interpret the rows (`kernelrl.web.views` does).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelrl.result import EvalResult
from kernelrl.sqlite import NewerSchema, OlderSchema, check_version, connect_reader, transaction
from kernelrl.store import steps
from kernelrl.store.records import RunMeta, RunRecord, RunStatus
from kernelrl.store.schema import SCHEMA

if TYPE_CHECKING:
    from kernelrl.jsontypes import JSONObject


class SnapshotError(RuntimeError):
    """The database cannot be read; the message says why, for a person."""


class NoDatabase(SnapshotError):
    """No file at the path yet (the run has not created it)."""


@contextmanager
def snapshot(path: str | Path) -> Iterator[Snapshot]:
    """One consistent, read-only state of the file at `path`, for the block's queries."""
    path = Path(path).resolve()
    if not path.is_file():
        raise NoDatabase(f"no database at {path} yet")
    try:
        conn = connect_reader(path, timeout=10.0)
    except sqlite3.Error as e:
        raise SnapshotError(f"{path}: cannot open ({e})") from e
    opened = False
    try:
        with transaction(conn, readonly=True):
            try:
                _check_schema(conn, path)
            except sqlite3.DatabaseError as e:
                raise SnapshotError(f"{path}: not a usable SQLite database ({e})") from e
            opened = True
            yield Snapshot(conn)
    except sqlite3.DatabaseError as e:
        if opened:  # a query's own error, not the file's
            raise
        raise SnapshotError(f"{path}: not a usable SQLite database ({e})") from e
    finally:
        conn.close()


def _check_schema(conn: sqlite3.Connection, path: Path) -> None:
    try:
        check_version(conn, SCHEMA)
    except OlderSchema as e:
        # Nothing yet, or a file a writer is creating or upgrading (step by step): its run page
        # waits for it. A file no writer opens stays so, and the message says what to do.
        raise NoDatabase(f"{path} holds no kernelrl tables yet" if e.found == 0 else str(e)) from None
    except NewerSchema as e:
        raise SnapshotError(str(e)) from None


# ------------------------------------------------------------------------------------- records


@dataclass(frozen=True, kw_only=True)
class TaskRow:
    name: str
    level: int | None
    source: str


@dataclass(frozen=True, kw_only=True)
class Baseline:
    eager_ms: float
    compile_ms: float | None
    compile_ci: tuple[float, float] | None = None  # 95 % interval of eager / compiled

    @property
    def compile_within_noise(self) -> bool:
        """torch.compile and eager could not be told apart on the task."""
        return self.compile_ci is not None and self.compile_ci[0] <= 1.0 <= self.compile_ci[1]


@dataclass(frozen=True, kw_only=True)
class CandidateRow:
    """A candidate without its prompt, answer or full result: what a run page needs."""

    id: int
    task: str
    chain: int
    step: int
    created: float
    status: str | None  # None: not evaluated yet
    speedup: float | None
    evaluated: float | None  # seconds since the epoch
    device: str | None
    size: str | None
    meta: RunMeta


@dataclass(frozen=True, kw_only=True)
class HackRow:
    candidate_id: int
    task: str
    rule: str
    stage: str
    message: str
    line: int | None
    created: float


@dataclass(frozen=True, kw_only=True)
class CandidateDetail:
    """Everything stored about one candidate."""

    id: int
    run_id: int | None
    task: str
    hash: str
    source: str
    parents: tuple[int, ...]
    chain: int
    step: int
    proposer: str
    answer: str
    prompt_tokens: int
    completion_tokens: int
    created: float
    state: str
    meta: RunMeta
    result: EvalResult | None
    reused_from: int | None
    evaluated: float | None


class Snapshot:
    """The queries of the watch pages, on one read transaction of a run database (`snapshot`)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def runs(self) -> list[tuple[RunRecord, int]]:
        """Every run with its candidate count, newest first."""
        conn = self._conn
        counts = dict(conn.execute("SELECT run_id, COUNT(*) FROM candidates GROUP BY run_id").fetchall())
        out = []
        for r in conn.execute("SELECT id, config, started, finished, status FROM runs ORDER BY id DESC").fetchall():
            out.append((_run(r), int(counts.get(r[0], 0))))
        return out

    def run(self, run_id: int) -> RunRecord | None:
        row = self._conn.execute("SELECT id, config, started, finished, status FROM runs WHERE id = ?",
                                 (run_id,)).fetchone()
        return _run(row) if row else None

    def tasks(self) -> dict[str, TaskRow]:
        return {r[0]: TaskRow(name=r[0], level=r[1], source=r[2])
                for r in self._conn.execute("SELECT name, level, source FROM tasks ORDER BY name").fetchall()}

    def baselines(self) -> dict[tuple[str, str, str], Baseline]:
        """(task, device, size) -> stored eager and torch.compile times."""
        return {(r[0], r[1], r[2]): Baseline(eager_ms=r[3], compile_ms=r[4],
                                             compile_ci=(r[5], r[6]) if r[5] is not None and r[6] is not None else None)
                for r in self._conn.execute("SELECT task, device, size, eager_ms, compile_ms, compile_ci_lo, "
                                            "compile_ci_hi FROM baselines").fetchall()}

    def candidates(self, run_id: int, task: str | None = None) -> list[CandidateRow]:
        """A run's candidates (of one task, or all) in creation order, with their verdict columns."""
        sql = ("SELECT c.id, c.task, c.chain, c.step, c.created, r.status, r.speedup, r.evaluated, r.device, "
               "r.size, c.meta FROM candidates c LEFT JOIN results r ON r.candidate_id = c.id WHERE c.run_id = ?")
        params: list[str | int] = [run_id]
        if task is not None:
            sql += " AND c.task = ?"
            params.append(task)
        return [CandidateRow(id=r[0], task=r[1], chain=r[2], step=r[3], created=r[4], status=r[5], speedup=r[6],
                             evaluated=r[7], device=r[8], size=r[9], meta=RunMeta.from_dict(_json_object(r[10])))
                for r in self._conn.execute(sql + " ORDER BY c.id", params).fetchall()]

    def count_candidates(self, run_id: int) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM candidates WHERE run_id = ?", (run_id,)).fetchone()[0])

    def results(self, ids: list[int]) -> dict[int, EvalResult]:
        """The full stored results of these candidates."""
        out: dict[int, EvalResult] = {}
        for start in range(0, len(ids), 500):  # SQLite's bound-parameter limit
            chunk = ids[start:start + 500]
            marks = ",".join("?" * len(chunk))
            for cid, text in self._conn.execute(
                    f"SELECT candidate_id, result FROM results WHERE candidate_id IN ({marks})", chunk).fetchall():
                out[int(cid)] = EvalResult.from_dict(json.loads(text))
        return out

    def judged_results(self, run_id: int, limit: int) -> list[tuple[float, EvalResult]]:
        """A run's latest `limit` verdicts its judge made (not reused from another candidate), each
        with when it was stored (seconds since the epoch), oldest first."""
        rows = self._conn.execute(
            "SELECT r.evaluated, r.result FROM candidates c JOIN results r ON r.candidate_id = c.id "
            "WHERE c.run_id = ? AND r.reused_from IS NULL ORDER BY r.evaluated DESC LIMIT ?", (run_id, limit)).fetchall()
        return [(float(t), EvalResult.from_dict(json.loads(text))) for t, text in reversed(rows)]

    def hack_cases(self, run_id: int, task: str | None = None, limit: int | None = None) -> list[HackRow]:
        """Refused programs of a run with each rule that refused them, newest first."""
        sql = ("SELECT h.candidate_id, h.task, h.rule, h.stage, h.message, h.line, h.created FROM hack_cases h "
               "JOIN candidates c ON c.id = h.candidate_id WHERE c.run_id = ?")
        params: list[str | int] = [run_id]
        if task is not None:
            sql += " AND h.task = ?"
            params.append(task)
        sql += " ORDER BY h.id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        return [HackRow(candidate_id=r[0], task=r[1], rule=r[2], stage=r[3], message=r[4], line=r[5],
                        created=r[6]) for r in self._conn.execute(sql, params).fetchall()]

    def refused_rules(self, run_id: int) -> dict[int, list[str]]:
        """candidate id -> rules that refused it, for a run's flagged candidates (reused verdicts too).

        A candidate whose verdict was reused from an earlier refusal is refused by the same rules, so
        the rules come from its stored findings, not only from the hack-case table (which keeps each
        refused source once)."""
        out: dict[int, list[str]] = {}
        for cid, rule in self._conn.execute(
                "SELECT f.candidate_id, f.rule FROM findings f JOIN results r ON r.candidate_id = f.candidate_id "
                "JOIN candidates c ON c.id = f.candidate_id WHERE c.run_id = ? AND r.status = 'flagged' "
                "AND f.severity = 'reject' ORDER BY f.id", (run_id,)).fetchall():
            rules = out.setdefault(int(cid), [])
            if rule not in rules:
                rules.append(rule)
        return out

    def candidate(self, candidate_id: int) -> CandidateDetail | None:
        row = self._conn.execute(
            "SELECT c.id, c.run_id, c.task, c.hash, c.source, c.parents, c.chain, c.step, c.proposer, c.answer, "
            "c.prompt_tokens, c.completion_tokens, c.created, c.state, c.meta, r.result, r.reused_from, r.evaluated "
            "FROM candidates c LEFT JOIN results r ON r.candidate_id = c.id WHERE c.id = ?",
            (candidate_id,)).fetchone()
        if row is None:
            return None
        return CandidateDetail(id=row[0], run_id=row[1], task=row[2], hash=row[3], source=row[4],
                               parents=tuple(int(p) for p in json.loads(row[5] or "[]")), chain=row[6], step=row[7],
                               proposer=row[8], answer=row[9], prompt_tokens=row[10], completion_tokens=row[11],
                               created=row[12], state=row[13], meta=RunMeta.from_dict(_json_object(row[14])),
                               result=EvalResult.from_dict(json.loads(row[15])) if row[15] is not None else None,
                               reused_from=row[16], evaluated=row[17])

    def sources(self, ids: list[int]) -> dict[int, str]:
        """The sources of these candidates (parents of the ones on a page)."""
        out: dict[int, str] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            marks = ",".join("?" * len(chunk))
            out.update((int(i), s) for i, s in self._conn.execute(
                f"SELECT id, source FROM candidates WHERE id IN ({marks})", chunk).fetchall())
        return out

    def train_steps(self, run_id: int) -> list[steps.StepRecord]:
        """A run's logged training steps in order (none when nothing was logged)."""
        return steps.read(self._conn, run_id)


def _run(r: tuple[Any, ...]) -> RunRecord:
    return RunRecord(id=r[0], config=_json_object(r[1]), started=r[2], finished=r[3], status=RunStatus(r[4]))


def _json_object(text: str | None) -> JSONObject:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
