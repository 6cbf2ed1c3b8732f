"""Every database the project writes (runs, the server's jobs and sessions, the LLM review cache)
connects the same way (`kernelrl.sqlite`): WAL, the sync level asked for, foreign keys unless asked
off, autocommit (transactions only where `transaction` opens them); a reader cannot write."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kernelrl.sqlite import connect_reader, connect_writer, transaction


@pytest.mark.parametrize(("durable", "foreign_keys"), [(False, True), (True, True), (True, False)])
def test_a_writer_has_the_settings_it_was_asked_for(tmp_path: Path, durable: bool, foreign_keys: bool) -> None:
    conn = connect_writer(tmp_path / "x.db", durable=durable, foreign_keys=foreign_keys)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == (2 if durable else 1)  # FULL, NORMAL
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == int(foreign_keys)
        assert conn.isolation_level is None and not conn.in_transaction
    finally:
        conn.close()


def test_the_stores_that_share_a_file_open_it_alike(tmp_path: Path) -> None:
    """The server's job store and session store write one file: both through `connect_writer`, durable."""
    from kernelrl.serve.jobs import JobStore
    from kernelrl.serve.session_store import SessionStore

    path = tmp_path / "server.db"
    jobs = JobStore(path)
    sessions = SessionStore(path)
    try:
        for store in (jobs, sessions):
            db = store._db
            assert db.execute("PRAGMA synchronous").fetchone()[0] == 2
            assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    finally:
        sessions.close()
        jobs.close()


def test_a_reader_cannot_write(tmp_path: Path) -> None:
    writer = connect_writer(tmp_path / "r.db")
    with transaction(writer):
        writer.execute("CREATE TABLE t (x INTEGER)")
    reader = connect_reader(tmp_path / "r.db")
    try:
        with pytest.raises(sqlite3.OperationalError):
            reader.execute("INSERT INTO t VALUES (1)")
    finally:
        reader.close()
        writer.close()


def test_the_llm_review_cache_opens_its_file_alike(tmp_path: Path) -> None:
    from kernelrl.checks.llm_judge import ReviewCache
    from kernelrl.result import ReviewAnswer

    path = tmp_path / "review.db"
    ReviewCache(path).put("k", ReviewAnswer.REAL, "plain", model="m", task_hash="t", candidate_hash="c")
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()
    assert ReviewCache(path).get("k") == (ReviewAnswer.REAL, "plain")  # a new process's view: the file
