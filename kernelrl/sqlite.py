"""SQLite as every database the project writes uses it: one way to connect, one way to run a transaction.

The run database (`kernelrl.search.database`), the reward server's job and session stores
(`kernelrl.serve.jobs`, `kernelrl.serve.session_store`) and the LLM review's cache
(`kernelrl.checks.llm_judge`) open their files here and run every transaction through `transaction`.

Guarantees:
- `connect_writer` gives a read-write connection in autocommit mode (`isolation_level=None`: a
  transaction is only what `transaction` opens), in WAL mode (checked: a file system that cannot
  give it is an `sqlite3.OperationalError` naming the file, never a silent rollback journal), with
  `synchronous=NORMAL` (a committed transaction survives a crash of the process; a power loss can
  drop the last ones, never corrupt the file) or `FULL` (`durable`: none lost), foreign keys on
  unless asked off (a migration that rebuilds a table turns them on after), and a 30 s wait for
  another process's write;
- `connect_reader` gives a read-only connection (`mode=ro`): the process can never write the file;
- `transaction(conn, lock)` holds `lock` (when given) for the whole transaction; a write
  transaction (`BEGIN IMMEDIATE`) is committed whole when its block ends, rolled back whole when
  the block raises (anything, `KeyboardInterrupt` included); a read one (`readonly=True`,
  `BEGIN`) sees one state of the file however fast a writer commits, and is always ended (rolled
  back) when its block ends.

Does not declare tables or versions: each store owns its schema and its migrations.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

# How long a connection waits for another process's write before it gives up.
BUSY_TIMEOUT_S = 30.0


@contextmanager
def transaction(conn: sqlite3.Connection, lock: AbstractContextManager[object] | None = None, *,
                readonly: bool = False) -> Iterator[sqlite3.Connection]:
    """One transaction on `conn` (opened with `isolation_level=None`), under `lock` when given.

    A write transaction is committed when the block ends and rolled back when it raises; a read
    transaction (`readonly=True`) is always rolled back: it only fixes the state the block sees.
    """
    with lock if lock is not None else nullcontext():
        conn.execute("BEGIN" if readonly else "BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            _end(conn, "ROLLBACK", quiet=readonly)
            raise
        _end(conn, "ROLLBACK" if readonly else "COMMIT", quiet=readonly)


def _end(conn: sqlite3.Connection, statement: str, *, quiet: bool) -> None:
    try:
        conn.execute(statement)
    except sqlite3.Error:
        if not quiet:  # a read transaction has nothing to lose; a failed write must be seen
            raise


def connect_writer(path: str | Path, *, check_same_thread: bool = False, durable: bool = False,
                   foreign_keys: bool = True) -> sqlite3.Connection:
    """A read-write connection (see the module docstring for its settings)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=check_same_thread, timeout=BUSY_TIMEOUT_S)
    try:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(f"{path}: cannot switch to WAL mode (got {mode})")
        conn.execute("PRAGMA synchronous=FULL" if durable else "PRAGMA synchronous=NORMAL")
        if foreign_keys:
            conn.execute("PRAGMA foreign_keys=ON")
    except BaseException:
        conn.close()
        raise
    return conn


def connect_reader(path: str | Path, *, timeout: float = BUSY_TIMEOUT_S) -> sqlite3.Connection:
    """A read-only connection (`mode=ro`): this process can never write the file."""
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=timeout)
