"""The run database's tables and their versions.

Every table of a run database is declared here: `SCHEMA`, a `kernelrl.sqlite.Schema` whose
migrations build them version by version (1: the first tables; 2: hack cases, filled from the
refusals a file holds; 3: results keep the evaluator config's fingerprint; 4: baseline
intervals; 5: the tasks' `identity_hash` column, named `source_hash` before), and `TRAIN_STEPS`,
the training step log's table, created on its first write. Its
connections, transactions and versions are `kernelrl.sqlite`'s, as every database the project
writes: a writer (`connect_writer`: WAL, `synchronous=NORMAL`, foreign keys) runs `migrate`, a
reader (`connect_reader`, `mode=ro`) runs `check_version`.

Guarantees:
- the version is `PRAGMA user_version`. A file written before that kept it in a one-row
  `schema_version` table: a file at user_version 0 is read as the version that row says (no row:
  0, a new file or one whose creation was cut short), and its first migration moves it to
  user_version. Every step also writes its version into that row, so a kernelrl from before the
  move still opens a file of a version it knows and refuses a newer one; this kernelrl never reads
  the row of a file at user_version above 0;
- each step is idempotent on what it creates (`IF NOT EXISTS`, a column added only when missing),
  so it also repairs a file left half-created by a kernelrl from before `user_version`;
- `is_run_database` looks at a file without opening it for writing and without any schema check.

Does not hold data or answer queries: `kernelrl.store.Database` (the writer and the
search's reads), `kernelrl.store.snapshot` (the watch pages' reads) and
`kernelrl.store.steps` (the step log) do.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from kernelrl.sqlite import Schema, connect_reader, execute_script


class DatabaseError(RuntimeError):
    """The database file cannot be used; the message says why, for a person."""


# Version 1: the first tables. Every step also repairs a file whose creation by a kernelrl from before
# `user_version` was cut short (its tables, of a later version then, made, but no row written).
_V1_TABLES = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    config TEXT NOT NULL,
    started REAL NOT NULL,
    finished REAL,
    status TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tasks (
    name TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    source_hash TEXT NOT NULL,
    level INTEGER,
    size TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS baselines (
    task TEXT NOT NULL,
    device TEXT NOT NULL,
    size TEXT NOT NULL,
    eager_ms REAL NOT NULL,
    compile_ms REAL,
    measured REAL NOT NULL,
    PRIMARY KEY (task, device, size)
);
CREATE TABLE IF NOT EXISTS candidates (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER REFERENCES runs(id),
    task TEXT NOT NULL,
    hash TEXT NOT NULL,
    source TEXT NOT NULL,
    parents TEXT NOT NULL,
    chain INTEGER NOT NULL,
    step INTEGER NOT NULL,
    proposer TEXT NOT NULL,
    prompt TEXT NOT NULL,
    answer TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    created REAL NOT NULL,
    state TEXT NOT NULL,
    meta TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS candidates_task ON candidates (task, hash);
CREATE INDEX IF NOT EXISTS candidates_run ON candidates (run_id, task, chain, step);
CREATE TABLE IF NOT EXISTS results (
    candidate_id INTEGER PRIMARY KEY REFERENCES candidates(id),
    task TEXT NOT NULL,
    hash TEXT NOT NULL,
    status TEXT NOT NULL,
    speedup REAL,
    cand_ms REAL,
    ref_ms REAL,
    device TEXT NOT NULL,
    size TEXT NOT NULL,
    policy TEXT NOT NULL,
    result TEXT NOT NULL,
    evaluated REAL NOT NULL,
    reused_from INTEGER,
    task_hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS results_task ON results (task, status, speedup);
CREATE INDEX IF NOT EXISTS results_dedup ON results (task, hash, device, size, policy);
CREATE TABLE IF NOT EXISTS findings (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    candidate_id INTEGER NOT NULL REFERENCES candidates(id),
    rule TEXT NOT NULL,
    severity TEXT NOT NULL,
    stage TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS findings_rule ON findings (rule);
"""

# Version 2: refused programs are kept as hack cases; a file's existing refusals fill the table.
_HACK_CASES = """
CREATE TABLE IF NOT EXISTS hack_cases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    candidate_id INTEGER NOT NULL REFERENCES candidates(id),
    task TEXT NOT NULL,
    hash TEXT NOT NULL,
    rule TEXT NOT NULL,
    stage TEXT NOT NULL,
    message TEXT NOT NULL,
    line INTEGER,
    created REAL NOT NULL,
    UNIQUE (task, hash, rule)
);
CREATE INDEX IF NOT EXISTS hack_cases_task ON hack_cases (task, id);
"""
_BACKFILL_HACK_CASES = """
INSERT OR IGNORE INTO hack_cases (candidate_id, task, hash, rule, stage, message, line, created)
SELECT f.candidate_id, r.task, r.hash, f.rule, f.stage, f.message, NULL, r.evaluated
FROM findings f JOIN results r ON r.candidate_id = f.candidate_id
WHERE r.status = 'flagged' AND f.severity = 'reject' AND r.reused_from IS NULL
ORDER BY f.id
"""


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _legacy_row(conn: sqlite3.Connection, version: int) -> None:
    """The version as a kernelrl from before `user_version` reads it (its `schema_version` table),
    so that one still opens the files it can and refuses the others."""
    conn.execute("DELETE FROM schema_version")
    conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))


def _to_1(conn: sqlite3.Connection) -> None:
    execute_script(conn, _V1_TABLES)
    _legacy_row(conn, 1)


def _to_2(conn: sqlite3.Connection) -> None:
    execute_script(conn, _HACK_CASES)
    conn.execute(_BACKFILL_HACK_CASES)
    _legacy_row(conn, 2)


def _to_3(conn: sqlite3.Connection) -> None:
    """Results keep the evaluator config's fingerprint. Results stored before are never reused:
    nothing says which tolerance, correctness sets or timing they were judged under."""
    if "fingerprint" not in _columns(conn, "results"):
        conn.execute("ALTER TABLE results ADD COLUMN fingerprint TEXT NOT NULL DEFAULT ''")
    conn.execute("DROP INDEX IF EXISTS results_dedup")
    conn.execute("CREATE INDEX IF NOT EXISTS results_reuse ON results (task, hash, fingerprint)")
    _legacy_row(conn, 3)


def _to_4(conn: sqlite3.Connection) -> None:
    """Baselines keep the 95 % interval of eager / compiled, measured in the same rounds (NULL: not known)."""
    columns = _columns(conn, "baselines")
    for name in ("compile_ci_lo", "compile_ci_hi"):
        if name not in columns:
            conn.execute(f"ALTER TABLE baselines ADD COLUMN {name} REAL")
    _legacy_row(conn, 4)


def _to_5(conn: sqlite3.Connection) -> None:
    """The tasks' hash column is named for what it holds, `Task.identity_hash` (the source and its
    size presets), not `source_hash` (the source alone)."""
    if "source_hash" in _columns(conn, "tasks"):
        conn.execute("ALTER TABLE tasks RENAME COLUMN source_hash TO identity_hash")
    _legacy_row(conn, 5)


def _legacy_version(conn: sqlite3.Connection) -> int:
    """A file written before `user_version`: the row of its `schema_version` table (0: none, a new
    file, or one whose creation was cut short before the row was written)."""
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone():
        return 0
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    return int(row[0]) if row else 0


SCHEMA = Schema("run database", (_to_1, _to_2, _to_3, _to_4, _to_5), legacy_version=_legacy_version)
SCHEMA_VERSION = SCHEMA.version

# The training step log (`kernelrl.store.steps`): one row per logging step of a training
# run. Not part of `SCHEMA`: it is created by its first write, so a file that never trained has none.
TRAIN_STEPS = """
CREATE TABLE IF NOT EXISTS train_steps (
    run_id INTEGER NOT NULL,
    step INTEGER NOT NULL,
    logged REAL NOT NULL,
    metrics TEXT NOT NULL,
    weights TEXT NOT NULL,
    open_levels TEXT NOT NULL,
    PRIMARY KEY (run_id, step)
)
"""

def is_run_database(path: Path) -> bool:
    """An SQLite file with a run database's `runs` and `candidates` tables (read-only look)."""
    try:
        with path.open("rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                return False
        conn = connect_reader(path, timeout=5)
        try:
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except (OSError, sqlite3.Error):
        return False
    return {"runs", "candidates"} <= names
