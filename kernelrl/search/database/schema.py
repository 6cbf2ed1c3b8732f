"""The run database's tables, their version and upgrades.

Every table of a run database is declared here (`SCHEMA`, and `TRAIN_STEPS`, the training step
log's table, created on its first write). Its connections and transactions are `kernelrl.sqlite`'s,
as every database the project writes: a writer (`connect_writer`: WAL, `synchronous=NORMAL`,
foreign keys), a reader (`connect_reader`, `mode=ro`), and `transaction`.

Guarantees:
- `upgrade` brings a file of any earlier version to `SCHEMA_VERSION` in one transaction (a
  file of a newer version is refused by `check_version` with a reason for a person); the table
  creation before it is idempotent (`IF NOT EXISTS`), so a crash half-way is repaired by the
  next open;
- `is_run_database` looks at a file without opening it for writing and without any schema check.

Does not hold data or answer queries: `kernelrl.search.database.Database` (the writer and the
search's reads), `kernelrl.search.database.snapshot` (the watch pages' reads) and
`kernelrl.search.database.steps` (the step log) do.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from pathlib import Path

from kernelrl.sqlite import connect_reader, transaction

SCHEMA_VERSION = 4  # 2: hack_cases; 3: results keep the evaluator config's fingerprint; 4: baseline intervals


class DatabaseError(RuntimeError):
    """The database file cannot be used; the message says why, for a person."""


SCHEMA = """
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
    -- 95 % interval of eager / compiled, measured in the same rounds (NULL: not known)
    compile_ci_lo REAL,
    compile_ci_hi REAL,
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
    task_hash TEXT NOT NULL,
    -- the evaluator config the result was judged under (kernelrl.judge.eval_config.config_fingerprint)
    fingerprint TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS results_task ON results (task, status, speedup);
CREATE INDEX IF NOT EXISTS results_reuse ON results (task, hash, fingerprint);
CREATE TABLE IF NOT EXISTS findings (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    candidate_id INTEGER NOT NULL REFERENCES candidates(id),
    rule TEXT NOT NULL,
    severity TEXT NOT NULL,
    stage TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS findings_rule ON findings (rule);
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

# The training step log (`kernelrl.search.database.steps`): one row per logging step of a training
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

# Version 1 files gain the hack-case table, filled from the refusals they already hold.
_BACKFILL_HACK_CASES = """
INSERT OR IGNORE INTO hack_cases (candidate_id, task, hash, rule, stage, message, line, created)
SELECT f.candidate_id, r.task, r.hash, f.rule, f.stage, f.message, NULL, r.evaluated
FROM findings f JOIN results r ON r.candidate_id = f.candidate_id
WHERE r.status = 'flagged' AND f.severity = 'reject' AND r.reused_from IS NULL
ORDER BY f.id
"""


def stored_version(conn: sqlite3.Connection) -> int | None:
    """The file's schema version; None when it has no version table or no row in it yet."""
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_version'").fetchone():
        return None
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    return int(row[0]) if row else None


def check_version(path: str | Path, version: int | None) -> None:
    """Refuse a file written by a newer schema than this kernelrl reads."""
    if version is not None and version > SCHEMA_VERSION:
        raise DatabaseError(f"{path} has schema version {version}; this kernelrl reads up to "
                            f"{SCHEMA_VERSION}; upgrade kernelrl")


def upgrade(conn: sqlite3.Connection, lock: AbstractContextManager[object], version: int | None) -> None:
    """Bring a file at `version` (None: new) to `SCHEMA_VERSION`."""
    with lock:
        # executescript commits on its own; the schema is idempotent (IF NOT EXISTS), so a
        # crash half-way is repaired by the next open.
        conn.executescript(SCHEMA)
        with transaction(conn) as c:
            if version is not None and version < 2:
                c.execute(_BACKFILL_HACK_CASES)
            if version is not None and version < 3:
                # Results stored before fingerprints were kept are never reused: nothing says
                # which tolerance, correctness sets or timing they were judged under.
                columns = {row[1] for row in c.execute("PRAGMA table_info(results)")}
                if "fingerprint" not in columns:
                    c.execute("ALTER TABLE results ADD COLUMN fingerprint TEXT NOT NULL DEFAULT ''")
                c.execute("DROP INDEX IF EXISTS results_dedup")
                c.execute("CREATE INDEX IF NOT EXISTS results_reuse ON results (task, hash, fingerprint)")
            if version is not None and version < 4:
                columns = {row[1] for row in c.execute("PRAGMA table_info(baselines)")}
                for name in ("compile_ci_lo", "compile_ci_hi"):
                    if name not in columns:
                        c.execute(f"ALTER TABLE baselines ADD COLUMN {name} REAL")
            c.execute("DELETE FROM schema_version")
            c.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))


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
