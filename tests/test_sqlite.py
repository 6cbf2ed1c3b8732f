"""Every database the project writes (runs, the server's jobs and sessions, the LLM review cache)
connects the same way (`kernelrl.sqlite`): WAL, the sync level asked for, foreign keys unless asked
off, autocommit (transactions only where `transaction` opens them); a reader cannot write. Each is
versioned the same way: `migrate` applies the missing steps of its `Schema`, each with its version
in one transaction, and refuses a newer file; `check_version` lets a reader take only its own
version; the run database's files from before `user_version` are adopted from their table."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kernelrl.sqlite import (
    NewerSchema,
    OlderSchema,
    Schema,
    check_version,
    connect_reader,
    connect_writer,
    migrate,
    stored_version,
    transaction,
)


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
    from kernelrl.serve.store import ServerStore

    server = ServerStore(tmp_path / "server.db")
    jobs = JobStore(server)
    sessions = SessionStore(server)
    try:
        for store in (jobs, sessions):
            db = store._db
            assert db.execute("PRAGMA synchronous").fetchone()[0] == 2
            assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    finally:
        server.close()


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


# ------------------------------------------------------------------------------------- versions


def _writer(path: Path) -> sqlite3.Connection:
    return connect_writer(path)


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _recording(ran: list[int], n: int) -> tuple[Callable[[sqlite3.Connection], None], ...]:
    """n steps; step i creates table t{i} and notes that it ran."""
    def step(i: int) -> Callable[[sqlite3.Connection], None]:
        def run(conn: sqlite3.Connection) -> None:
            conn.execute(f"CREATE TABLE t{i} (x INTEGER)")
            ran.append(i)
        return run
    return tuple(step(i) for i in range(n))


def test_a_new_file_gets_every_step_in_order(tmp_path: Path) -> None:
    ran: list[int] = []
    conn = _writer(tmp_path / "f.db")
    try:
        assert migrate(conn, Schema("toy", _recording(ran, 3))) == 0  # the version it found
        assert ran == [0, 1, 2]
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3 and {"t0", "t1", "t2"} <= _tables(conn)
    finally:
        conn.close()


def test_a_file_at_an_older_version_gets_only_the_missing_steps(tmp_path: Path) -> None:
    conn = _writer(tmp_path / "f.db")
    try:
        migrate(conn, Schema("toy", _recording([], 2)))
        ran: list[int] = []
        assert migrate(conn, Schema("toy", _recording(ran, 4))) == 2
        assert ran == [2, 3] and conn.execute("PRAGMA user_version").fetchone()[0] == 4
        migrate(conn, Schema("toy", _recording(ran, 4)))  # at its version: nothing more
        assert ran == [2, 3]
    finally:
        conn.close()


def test_a_writer_refuses_a_newer_file_naming_it_and_both_versions(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    conn = _writer(path)
    try:
        conn.execute("PRAGMA user_version = 5")
        ran: list[int] = []
        with pytest.raises(NewerSchema) as e:
            migrate(conn, Schema("toy database", _recording(ran, 3)))
        assert (e.value.found, e.value.supported) == (5, 3)
        assert str(path) in str(e.value) and "toy database" in str(e.value)
        assert "schema version 5" in str(e.value) and "(3)" in str(e.value)
        assert ran == [] and conn.execute("PRAGMA user_version").fetchone()[0] == 5  # nothing written
    finally:
        conn.close()


def test_a_step_that_raises_leaves_the_file_whole_at_the_version_before_it(tmp_path: Path) -> None:
    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half (x INTEGER)")
        conn.execute("INSERT INTO t0 VALUES (2)")
        raise RuntimeError("step 1 fails half-way")

    conn = _writer(tmp_path / "f.db")
    try:
        steps = ("CREATE TABLE t0 (x INTEGER); INSERT INTO t0 VALUES (1);", broken)
        with pytest.raises(RuntimeError, match="half-way"):
            migrate(conn, Schema("toy", steps))
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        assert "half" not in _tables(conn) and conn.execute("SELECT x FROM t0").fetchall() == [(1,)]
        assert not conn.in_transaction
    finally:
        conn.close()


def test_two_writers_migrating_one_file_at_once_apply_each_step_once(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    inside, release = threading.Event(), threading.Event()

    def slow(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE log (x INTEGER)")  # a second run of this step would fail here
        inside.set()
        release.wait(10)

    schema = Schema("toy", (slow,))
    first, second = _writer(path), _writer(path)
    errors: list[BaseException] = []

    def run(conn: sqlite3.Connection) -> None:
        try:
            migrate(conn, schema)
        except BaseException as e:  # noqa: BLE001 - seen by the test's thread
            errors.append(e)

    a = threading.Thread(target=run, args=(first,))
    a.start()
    assert inside.wait(10)
    b = threading.Thread(target=run, args=(second,))
    b.start()  # reads version 0 (the step is not committed), then waits for the write lock
    time.sleep(0.3)
    release.set()
    a.join(30)
    b.join(30)
    try:
        assert errors == [] and second.execute("PRAGMA user_version").fetchone()[0] == 1
    finally:
        first.close()
        second.close()


def test_a_reader_refuses_a_newer_file(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    writer = _writer(path)
    migrate(writer, Schema("toy", _recording([], 2)))
    writer.execute("PRAGMA user_version = 3")
    reader = connect_reader(path)
    try:
        with pytest.raises(NewerSchema) as e:
            check_version(reader, Schema("toy", _recording([], 2)))
        assert (e.value.found, e.value.supported) == (3, 2) and str(path) in str(e.value)
    finally:
        reader.close()
        writer.close()


def test_a_reader_refuses_an_older_file_and_never_migrates_it(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    writer = _writer(path)
    migrate(writer, Schema("toy", _recording([], 1)))
    reader = connect_reader(path)
    try:
        ran: list[int] = []
        with pytest.raises(OlderSchema) as e:
            check_version(reader, Schema("toy", _recording(ran, 2)))
        assert (e.value.found, e.value.supported) == (1, 2) and ran == []
        assert writer.execute("PRAGMA user_version").fetchone()[0] == 1
    finally:
        reader.close()
        writer.close()


# The run database as a kernelrl from before `user_version` left it: its version in a table.


def _legacy_run_database(path: Path, version: int) -> None:
    """A run database of `version` (from 1) written before its version moved to user_version."""
    from kernelrl.store.schema import SCHEMA

    conn = connect_writer(path)
    try:
        migrate(conn, Schema("run database", SCHEMA.migrations[:version]))
        conn.execute("PRAGMA user_version = 0")  # what such a kernelrl never wrote
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(version,)]
    finally:
        conn.close()


def test_a_legacy_run_database_is_at_the_version_its_table_says(tmp_path: Path) -> None:
    from kernelrl.store.schema import SCHEMA

    _legacy_run_database(tmp_path / "run.db", 2)
    conn = connect_reader(tmp_path / "run.db")
    try:
        assert stored_version(conn, SCHEMA) == 2
    finally:
        conn.close()


def test_a_legacy_run_database_moves_its_version_to_user_version_with_only_the_missing_steps(tmp_path: Path) -> None:
    from kernelrl.store import Database
    from kernelrl.store.schema import SCHEMA, SCHEMA_VERSION

    path = tmp_path / "run.db"
    _legacy_run_database(path, 1)
    ran: list[int] = []

    def noting(i: int) -> Callable[[sqlite3.Connection], None]:
        step = SCHEMA.migrations[i]
        assert callable(step)

        def run(conn: sqlite3.Connection) -> None:
            ran.append(i)
            step(conn)
        return run

    steps = tuple(noting(i) for i in range(SCHEMA_VERSION))
    conn = connect_writer(path)
    try:
        assert migrate(conn, Schema(SCHEMA.name, steps, legacy_version=SCHEMA.legacy_version)) == 1
        assert ran == list(range(1, SCHEMA_VERSION))
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()
    with Database(path) as db:
        assert db.schema_version == SCHEMA_VERSION


def test_a_version_1_run_database_keeps_its_refusals_as_hack_cases(tmp_path: Path) -> None:
    """The first tables, with a refused candidate, become today's: the column and the hack case."""
    from kernelrl.store import Database

    path = tmp_path / "run.db"
    _legacy_run_database(path, 1)
    with sqlite3.connect(path) as c:
        c.execute("INSERT INTO candidates (task, hash, source, parents, chain, step, proposer, prompt, answer, "
                  "prompt_tokens, completion_tokens, created, state, meta) "
                  "VALUES ('t', 'h', 'src', '[]', 0, 0, 'p', '', '', 0, 0, 1.0, 'evaluated', '{}')")
        c.execute("INSERT INTO results (candidate_id, task, hash, status, device, size, policy, result, evaluated, "
                  "task_hash) VALUES (1, 't', 'h', 'flagged', 'cpu', 'small', 'open', '{}', 2.0, '')")
        c.execute("INSERT INTO findings (candidate_id, rule, severity, stage, message) "
                  "VALUES (1, 'cached_output', 'reject', 'static', 'm')")
    with Database(path) as db:
        assert [(h.task, h.rule) for h in db.hack_cases()] == [("t", "cached_output")]
        assert db._query("SELECT fingerprint FROM results") == [("",)]


def test_a_reader_takes_a_legacy_run_database_of_its_version(tmp_path: Path) -> None:
    from kernelrl.store import Database
    from kernelrl.store.schema import SCHEMA_VERSION
    from kernelrl.store.snapshot import snapshot

    path = tmp_path / "run.db"
    _legacy_run_database(path, SCHEMA_VERSION)
    with snapshot(path) as snap:
        assert snap._conn.execute("PRAGMA user_version").fetchone()[0] == 0  # read as it is, not migrated
    with Database(path, readonly=True) as db:
        assert db.schema_version == SCHEMA_VERSION


def test_a_run_database_reader_refuses_a_newer_file(tmp_path: Path) -> None:
    from kernelrl.store import Database, DatabaseError
    from kernelrl.store.schema import SCHEMA_VERSION
    from kernelrl.store.snapshot import NoDatabase, SnapshotError, snapshot

    path = tmp_path / "run.db"
    Database(path).close()
    with sqlite3.connect(path) as c:
        c.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(DatabaseError, match=f"schema version {SCHEMA_VERSION + 1}"):
        Database(path, readonly=True)
    with pytest.raises(SnapshotError, match=f"schema version {SCHEMA_VERSION + 1}") as e, snapshot(path):
        pass
    assert not isinstance(e.value, NoDatabase)


def test_a_run_database_reader_waits_for_an_older_file(tmp_path: Path) -> None:
    """A snapshot of an older file (being created, or not yet upgraded) waits, saying the versions;
    a read-only `Database` refuses it."""
    from kernelrl.store import Database, DatabaseError
    from kernelrl.store.schema import SCHEMA_VERSION
    from kernelrl.store.snapshot import NoDatabase, snapshot

    path = tmp_path / "run.db"
    _legacy_run_database(path, SCHEMA_VERSION - 1)
    with pytest.raises(NoDatabase, match=f"schema version {SCHEMA_VERSION - 1}"), snapshot(path):
        pass
    with pytest.raises(DatabaseError, match="older than this kernelrl reads"):
        Database(path, readonly=True)


def test_an_unversioned_llm_review_cache_is_version_1_with_its_answers(tmp_path: Path) -> None:
    from kernelrl.checks.llm_judge import CACHE_SCHEMA, ReviewCache
    from kernelrl.result import ReviewAnswer

    path = tmp_path / "review.db"
    with sqlite3.connect(path) as c:  # as the cache was written before it kept a version
        c.execute("CREATE TABLE verdicts (key TEXT PRIMARY KEY, verdict TEXT NOT NULL, reason TEXT NOT NULL, "
                  "model TEXT NOT NULL, task_hash TEXT NOT NULL, candidate_hash TEXT NOT NULL, created REAL NOT NULL)")
        c.execute("INSERT INTO verdicts VALUES ('k', 'hack', 'why', 'm', 't', 'c', 1.0)")
    assert ReviewCache(path).get("k") == (ReviewAnswer.HACK, "why")
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == CACHE_SCHEMA.version == 1
