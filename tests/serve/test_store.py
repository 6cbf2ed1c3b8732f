"""The reward server's database: one file, one connection, one versioned schema for jobs and sessions."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from kernelrl.checks.policy import PolicyName
from kernelrl.episodes.episode import EpisodeConfig
from kernelrl.serve.jobs import JobStore
from kernelrl.serve.session_store import SessionStore
from kernelrl.serve.store import SCHEMA, ServerStore, StoreError
from kernelrl.sqlite import Schema, connect_writer, migrate
from kernelrl.tasks.task import Size, Task

TASK = Task(name="t", source="import torch\n")


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as c:
        return {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_a_file_at_version_2_gains_the_sessions_with_its_jobs_kept(tmp_path: Path) -> None:
    path = tmp_path / "serve.db"
    conn = connect_writer(path)
    migrate(conn, Schema(SCHEMA.name, SCHEMA.migrations[:2]))  # the job store as it was, alone
    conn.execute("INSERT INTO jobs (id, state, size, policy, n_items, n_eval, created_s) "
                 "VALUES ('j', 'queued', 'small', 'open', 1, 1, 1.0)")
    conn.close()
    assert "sessions" not in _tables(path)
    ServerStore(path).close()
    assert {"jobs", "items", "sessions", "session_turns"} <= _tables(path)
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA.version == 3
        assert c.execute("SELECT id, state FROM jobs").fetchall() == [("j", "queued")]


def test_the_session_store_opens_a_new_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "serve.db"
    store = SessionStore(path)  # no job store made the file first
    try:
        s = store.create(owner="a", task=TASK, size=Size.SMALL, policy=PolicyName.OPEN,
                         episode=EpisodeConfig(turns=1), profile_job=None)
        assert store.get(s.id, owner="a") is not None
    finally:
        store.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert {"jobs", "items", "sessions", "session_turns"} <= _tables(path)


def test_the_job_and_session_stores_share_the_servers_one_connection(tmp_path: Path) -> None:
    server = ServerStore(tmp_path / "serve.db")
    jobs, sessions = JobStore(server), SessionStore(server)
    assert jobs._db is sessions._db is server.db and jobs._lock is sessions._lock is server.lock
    jobs.close()
    sessions.close()  # built on the server store: they leave it open
    assert server.db.execute("SELECT COUNT(*) FROM jobs").fetchone() == (0,)
    server.close()
    with pytest.raises(sqlite3.ProgrammingError):
        server.db.execute("SELECT 1")


def test_a_newer_file_is_refused_naming_both_versions(tmp_path: Path) -> None:
    path = tmp_path / "serve.db"
    ServerStore(path).close()
    with sqlite3.connect(path) as c:
        c.execute(f"PRAGMA user_version = {SCHEMA.version + 1}")
    with pytest.raises(StoreError, match=f"schema version {SCHEMA.version + 1}, newer than this kernelrl reads "
                                         fr"\({SCHEMA.version}\)"):
        ServerStore(path)
