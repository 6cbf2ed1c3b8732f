"""SQLite's one transaction helper and its connections (`kernelrl.sqlite`, as the run database uses
them), and the step log's table."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from kernelrl.sqlite import connect_reader, connect_writer, transaction
from kernelrl.store import Database
from kernelrl.store.schema import DatabaseError, is_run_database
from kernelrl.store.snapshot import NoDatabase, SnapshotError, snapshot
from kernelrl.store.steps import StepRecord


def _table(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")


def test_a_write_transaction_commits_whole_or_not_at_all(tmp_path: Path) -> None:
    conn = connect_writer(tmp_path / "f.db")
    _table(conn)
    lock = threading.RLock()
    with transaction(conn, lock) as c:
        c.execute("INSERT INTO t VALUES (1)")
        c.execute("INSERT INTO t VALUES (2)")
    with pytest.raises(KeyboardInterrupt), transaction(conn, lock) as c:
        c.execute("INSERT INTO t VALUES (3)")
        raise KeyboardInterrupt
    assert [r[0] for r in conn.execute("SELECT x FROM t ORDER BY x")] == [1, 2]
    assert not conn.in_transaction
    conn.close()


def test_a_read_transaction_sees_one_state_and_cannot_write(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    writer = connect_writer(path)
    _table(writer)
    writer.execute("INSERT INTO t VALUES (1)")
    reader = connect_reader(path)
    with transaction(reader, readonly=True) as r:
        assert r.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 1
        with transaction(writer) as w:
            w.execute("INSERT INTO t VALUES (2)")
        assert r.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 1  # the writer's commit is not seen
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            r.execute("DELETE FROM t")
    assert not reader.in_transaction
    assert reader.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 2
    reader.close()
    writer.close()


def test_is_run_database(tmp_path: Path) -> None:
    Database(tmp_path / "run.db").close()
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE runs (x)")
    (tmp_path / "text.db").write_text("not sqlite")
    assert is_run_database(tmp_path / "run.db")
    assert not is_run_database(other) and not is_run_database(tmp_path / "text.db")
    assert not is_run_database(tmp_path / "missing.db")


def test_the_step_log_through_the_writer_and_a_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "run.db"
    with Database(path) as db:
        run = db.start_run({"stage": "grpo"})
        assert db.train_steps(run) == []  # no table yet: no rows
        db.log_step(StepRecord(run_id=run, step=1, logged=1.0, metrics={"loss": 1.0, "kl": 0.5},
                               weights={"a": 1.0}, open_levels=(1,)))
        db.log_step(StepRecord(run_id=run, step=1, logged=2.0, metrics={"loss": 0.5},
                               weights={"a": 2.0}, open_levels=(1, 2)))
        rows = db.train_steps(run)
    assert len(rows) == 1 and rows[0].metrics == {"loss": 0.5, "kl": 0.5} and rows[0].weights == {"a": 2.0}
    assert rows[0].open_levels == (1, 2) and rows[0].logged == 2.0
    with snapshot(path) as snap:
        assert snap.train_steps(run) == rows and snap.train_steps(run + 1) == []


def test_a_step_log_written_the_old_way_reads_the_same(tmp_path: Path) -> None:
    """A file whose step log was written by an earlier kernelrl (its own connection) reads the same."""
    path = tmp_path / "run.db"
    with Database(path) as db:
        run = db.start_run({"stage": "grpo"})
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE IF NOT EXISTS train_steps (run_id INTEGER NOT NULL, step INTEGER NOT NULL, "
                  "logged REAL NOT NULL, metrics TEXT NOT NULL, weights TEXT NOT NULL, open_levels TEXT NOT NULL, "
                  "PRIMARY KEY (run_id, step))")
        c.execute("INSERT INTO train_steps VALUES (?, 3, 5.0, '{\"loss\": 0.25}', '{\"a\": 1.0}', '[1]')", (run,))
    with Database(path, readonly=True) as db:
        assert db.train_steps(run) == [StepRecord(run_id=run, step=3, logged=5.0, metrics={"loss": 0.25},
                                                  weights={"a": 1.0}, open_levels=(1,))]


def test_snapshot_errors(tmp_path: Path) -> None:
    with pytest.raises(NoDatabase), snapshot(tmp_path / "none.db"):
        pass
    (tmp_path / "text.db").write_text("not an SQLite file, long enough to be read as one" * 20)
    with pytest.raises(SnapshotError, match="not a usable SQLite database"), snapshot(tmp_path / "text.db"):
        pass
    with pytest.raises(DatabaseError, match="not a usable SQLite database"):
        Database(tmp_path / "text.db")
