"""The reward server's database: one SQLite file, one connection, one versioned schema for its jobs and sessions.

`ServerStore(path)` opens the file once (created readable by its owner only, WAL,
`synchronous=FULL`: what the server answered is on disk) and brings it to `SCHEMA`'s version
(`kernelrl.sqlite.migrate`); the job store (`kernelrl.serve.jobs.JobStore`) and the session
store (`kernelrl.serve.session_store.SessionStore`) are built on it and share its connection and
its lock. Every table of the file is declared here, as the schema's steps:

1. the first job store: jobs and their items, keys unique across clients;
2. jobs gain a kind (evaluate, profile), an owner, an error and the failed state (the table is
   rebuilt, its rows kept), items an owner, and keys become unique per owner;
3. the sessions and their turns (`IF NOT EXISTS`: a file at version 2 may already hold them, made
   by the session store before the file's version covered its tables).

Guarantees:
- the version is `PRAGMA user_version` (the numbers the job store used stay: 2 is the jobs as
  they are); a file at user_version 0 holding a jobs table is a file of the first schema
  (version 1, from before the job store kept a version) and is migrated with its jobs;
- each step and its version bump are one transaction: a failed step leaves the file at the
  version before it, whole; a file of a newer version is refused (`StoreError`, naming the file
  and both versions) before anything is written;
- the database and its WAL and shared-memory files are created readable by their owner only
  (0600), and an existing one is made so (with a warning);
- one connection and one lock: the two stores' transactions never interleave, and either store
  may be opened alone on a new file.

Does not hold the stores' queries (`kernelrl.serve.jobs`, `kernelrl.serve.session_store` do), and
does not keep two servers off one file (the server's lock file beside it does).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import threading
from contextlib import AbstractContextManager
from pathlib import Path

from kernelrl.sqlite import Schema, SchemaError, connect_writer, migrate, transaction

log = logging.getLogger("kernelrl.serve")


class StoreError(Exception):
    """The database cannot be used (written by a newer kernelrl, say); the message says why."""


# Version 1: the first job store.
_FIRST_JOBS = """
CREATE TABLE jobs (
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
CREATE INDEX jobs_state ON jobs (state, seq);
CREATE TABLE items (
    job_seq INTEGER NOT NULL REFERENCES jobs (seq),
    idx INTEGER NOT NULL,
    task TEXT NOT NULL,  -- JSON: name, source, level, suite, presets
    task_hash TEXT NOT NULL,
    candidate TEXT NOT NULL,  -- '' in a profile job
    candidate_hash TEXT NOT NULL,
    key TEXT,  -- idempotency key (per owner from version 2)
    origin_seq INTEGER,  -- set when the key was already stored: that item holds the result
    origin_idx INTEGER,
    status TEXT,  -- the verdict (evaluations only)
    result TEXT,  -- JSON: EvalResult.to_dict(), or ProfileOutcome.to_dict() in a profile job
    finished_s REAL,
    PRIMARY KEY (job_seq, idx)
);
CREATE UNIQUE INDEX items_key ON items (key) WHERE key IS NOT NULL AND origin_seq IS NULL;
CREATE INDEX items_status ON items (status);
CREATE INDEX items_finished ON items (finished_s);
"""

# Version 2: jobs gain kind, owner, error and the failed state (a CHECK: the table is rebuilt, with
# foreign keys off as `migrate` runs every step), items the job's owner, and keys become unique per
# owner.
_JOBS_2 = """
CREATE TABLE jobs_v2 (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL DEFAULT 'evaluate' CHECK (kind IN ('evaluate', 'profile')),
    owner TEXT NOT NULL DEFAULT '',  -- the client (token name) that submitted it, '' without tokens
    state TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed')),
    size TEXT NOT NULL,
    policy TEXT NOT NULL,
    n_items INTEGER NOT NULL,
    n_eval INTEGER NOT NULL,  -- items this job evaluates itself (the others are answered from keys)
    attempts INTEGER NOT NULL DEFAULT 0,
    created_s REAL NOT NULL,
    started_s REAL,
    finished_s REAL,
    error TEXT  -- why a failed job failed
);
INSERT INTO jobs_v2 (seq, id, state, size, policy, n_items, n_eval, attempts, created_s, started_s, finished_s)
    SELECT seq, id, state, size, policy, n_items, n_eval, attempts, created_s, started_s, finished_s FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_v2 RENAME TO jobs;
CREATE INDEX jobs_state ON jobs (state, seq);
CREATE INDEX jobs_finished ON jobs (finished_s);
ALTER TABLE items ADD COLUMN owner TEXT NOT NULL DEFAULT '';
DROP INDEX items_key;
CREATE UNIQUE INDEX items_owner_key ON items (owner, key) WHERE key IS NOT NULL AND origin_seq IS NULL;
CREATE INDEX items_origin ON items (origin_seq) WHERE origin_seq IS NOT NULL;
"""

# Version 3: refinement sessions (`kernelrl.serve.session_store`) and their turns.
_SESSIONS = """
CREATE TABLE IF NOT EXISTS sessions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    key TEXT,  -- the client's creation key (retries of a create return this session)
    task TEXT NOT NULL,  -- JSON, as jobs store it
    size TEXT NOT NULL,
    policy TEXT NOT NULL,
    turns INTEGER NOT NULL,
    gamma REAL NOT NULL,
    history_tokens INTEGER NOT NULL,
    profile_job TEXT,  -- the profile job whose answer the base prompt is built from
    base_prompt TEXT,  -- built once, when the profile is known
    profile_error TEXT,  -- why the prompt has no profile (the task's reference fails, say)
    created_s REAL NOT NULL,
    updated_s REAL NOT NULL,
    closed_s REAL
);
CREATE UNIQUE INDEX IF NOT EXISTS sessions_owner_key ON sessions (owner, key) WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS sessions_owner ON sessions (owner, closed_s);
CREATE TABLE IF NOT EXISTS session_turns (
    session_seq INTEGER NOT NULL REFERENCES sessions (seq),
    number INTEGER NOT NULL,
    answer TEXT,  -- the model's answer, NULL when a bare candidate was sent
    code TEXT,  -- the program judged; NULL: the answer held no complete code block
    key TEXT,  -- the idempotency key of its evaluation (NULL without code)
    job TEXT,  -- the job judging it, once submitted
    state TEXT NOT NULL CHECK (state IN ('pending', 'judged', 'failed')),
    result TEXT,  -- JSON: EvalResult.to_dict()
    verdict TEXT,  -- what the next turn's prompt shows (kernelrl.episodes.feedback)
    reward TEXT,  -- JSON: Reward.to_dict(), or null (nothing to pay: task_error)
    error TEXT,  -- why a failed turn failed
    created_s REAL NOT NULL,
    finished_s REAL,
    PRIMARY KEY (session_seq, number)
);
"""


def _first_schema(conn: sqlite3.Connection) -> int:
    """A file at user_version 0 with a jobs table was written by the first job store (version 1)."""
    return 1 if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone() else 0


SCHEMA = Schema("reward server database", (_FIRST_JOBS, _JOBS_2, _SESSIONS), legacy_version=_first_schema)


class ServerStore:
    """The reward server's database file, opened once; see the module docstring."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _private(self.path)
        self.lock = threading.Lock()
        self.db = connect_writer(self.path, durable=True)
        try:
            found = migrate(self.db, SCHEMA, self.lock)
        except SchemaError as e:
            self.db.close()
            raise StoreError(str(e)) from None
        except BaseException:
            self.db.close()
            raise
        if 0 < found < SCHEMA.version:
            log.warning("%s: the reward server's database was brought from schema %d to %d (jobs and sessions "
                        "kept)", self.path, found, SCHEMA.version)

    def write(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction under the store's lock (`kernelrl.sqlite.transaction`)."""
        return transaction(self.db, self.lock)

    def close(self) -> None:
        with self.lock:
            self.db.close()


class StoreTables:
    """Tables of the server's file, on a `ServerStore` (its connection and lock), or on a path (a
    `ServerStore` of their own, closed by `close`): what `JobStore` and `SessionStore` share."""

    def __init__(self, store: ServerStore | str | Path) -> None:
        self._owns = not isinstance(store, ServerStore)
        self.server = store if isinstance(store, ServerStore) else ServerStore(store)
        self.path = self.server.path
        self._db = self.server.db
        self._lock = self.server.lock

    def close(self) -> None:
        """Close the file when these tables opened it; on a `ServerStore` it is left to its owner."""
        if self._owns:
            self.server.close()

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        return self.server.write()


def _private(path: Path) -> None:
    """Create `path` readable by its owner only, or make an existing one so (SQLite gives the
    WAL and shared-memory files the database's mode)."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            mode = stat.S_IMODE(os.stat(p).st_mode)
        except FileNotFoundError:
            continue
        if mode & 0o077:
            os.chmod(p, mode & 0o700)
            log.warning("%s was readable by others (mode %04o): now %04o", p, mode, mode & 0o700)
