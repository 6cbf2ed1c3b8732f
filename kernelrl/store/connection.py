"""The run database's file: one connection, its lock, its transactions and its schema check.

`Connection` is what every part of `kernelrl.store.Database` stands on (`runs`, `tasks`,
`candidates`, `queries` add the tables' reads and writes to it); callers use `Database`.

Guarantees:
- a file opened for writing is created if missing (mode 0600: candidates, prompts and answers are
  its owner's alone; an existing file keeps its mode), switched to WAL and brought up to
  `SCHEMA_VERSION` with the other processes that open it at once taking turns (an flock held
  while opening); a file opened read-only must exist and be at `SCHEMA_VERSION`, and is never
  written (`kernelrl.sqlite.check_version`);
- a file that is not a usable SQLite database, or of a newer schema, is a `DatabaseError` saying so;
- every read and write holds one re-entrant lock, so threads may share the object; `_tx` is one
  write transaction, committed whole or rolled back whole (`kernelrl.sqlite.transaction`), and is
  refused on a read-only object.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Self

from kernelrl.sqlite import (
    SchemaError,
    check_version,
    connect_reader,
    connect_writer,
    migrate,
    stored_version,
    transaction,
)
from kernelrl.store.schema import SCHEMA, DatabaseError


class Connection:
    """A run database file, open for writing or read-only. Use as a context manager or call `close()`."""

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

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
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
