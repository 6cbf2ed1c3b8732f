"""SQLite as every database the project writes uses it: one way to connect, one way to run a
transaction, one way to version a file.

The run database (`kernelrl.store`), the reward server's database (`kernelrl.serve.store`:
its jobs and sessions) and the LLM review's cache (`kernelrl.checks.llm_judge`) open their files
here, run every transaction through `transaction`, and declare their tables as a `Schema` that
`migrate` applies (a writer) or `check_version` checks (a reader).

Guarantees:
- `connect_writer` gives a read-write connection in autocommit mode (`isolation_level=None`: a
  transaction is only what `transaction` opens), in WAL mode (checked: a file system that cannot
  give it is an `sqlite3.OperationalError` naming the file, never a silent rollback journal), with
  `synchronous=NORMAL` (a committed transaction survives a crash of the process; a power loss can
  drop the last ones, never corrupt the file) or `FULL` (`durable`: none lost), foreign keys on
  unless asked off, and a 30 s wait for another process's write;
- `connect_reader` gives a read-only connection (`mode=ro`): the process can never write the file;
- `transaction(conn, lock)` holds `lock` (when given) for the whole transaction; a write
  transaction (`BEGIN IMMEDIATE`) is committed whole when its block ends, rolled back whole when
  the block raises (anything, `KeyboardInterrupt` included); a read one (`readonly=True`,
  `BEGIN`) sees one state of the file however fast a writer commits, and is always ended (rolled
  back) when its block ends;
- a file's version is in one place, `PRAGMA user_version`: `Schema.migrations[i]` takes a file
  from version i to i + 1, so version 0 is a file holding nothing of the schema and the newest is
  `Schema.version` (the number of migrations). A store that kept its version elsewhere before says
  how to read it (`Schema.legacy_version`, asked only of a file at user_version 0);
- `migrate` (a writer) applies every pending step in order, each step and its version bump in one
  write transaction: a step that raises leaves the file at the version before it, whole (the error
  goes on, with a note naming the file and the step); a step that ends the transaction itself is
  such an error, found as it returns (what it committed stays: steps must not commit). The
  version is read again inside each step's transaction, so two processes migrating one file at
  once apply each step once. A file of a newer version is refused (`NewerSchema`, naming the file
  and both versions) before anything is written. Foreign keys are off while the steps run (a step
  may rebuild a table) and restored after;
- `check_version` (a reader) accepts only a file at the schema's own version: a newer file is
  `NewerSchema`, an older one `OlderSchema` (its `found` is 0 for a file holding nothing of the
  schema yet). A reader never migrates: an older file is brought up to date by the next writer
  that opens it, so a reader that can wait for one (the watch pages) treats it as not ready yet.

Does not guarantee: that a step keeps foreign-key references whole (no `foreign_key_check` is
run: each step is written to), nor what a kernelrl from before its store used `user_version`
does with a file (each store's schema says what it keeps for one).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
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


# ------------------------------------------------------------------------------------- versions

# One step of a schema: SQL text (its statements run one by one inside the step's transaction; no
# BEGIN or COMMIT of its own), or a function given the connection inside that transaction.
Migration = str | Callable[[sqlite3.Connection], None]


@dataclass(frozen=True)
class Schema:
    """A database's tables as the steps that build them: `migrations[i]` takes a file from version
    i to i + 1 (`PRAGMA user_version`); `version`, their number, is the newest."""

    name: str  # what the file is, for a person: "run database", "reward server database", ...
    migrations: tuple[Migration, ...]
    # The version of a file at user_version 0 that its store versioned elsewhere before (a table,
    # the tables it holds); 0: nothing of the schema. Only reads; asked of readers and writers alike.
    legacy_version: Callable[[sqlite3.Connection], int] | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.migrations:
            raise ValueError("a schema needs a name and at least one migration")

    @property
    def version(self) -> int:
        return len(self.migrations)


class SchemaError(RuntimeError):
    """A file's version is not the one its schema can use here; the message says why, for a person."""

    def __init__(self, message: str, *, path: str, schema: str, found: int, supported: int) -> None:
        super().__init__(message)
        self.path = path
        self.schema = schema
        self.found = found
        self.supported = supported


class NewerSchema(SchemaError):
    """The file was written by a newer kernelrl (a later version of the schema)."""


class OlderSchema(SchemaError):
    """A reader found a file at an earlier version (0: nothing of the schema yet)."""


def user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def stored_version(conn: sqlite3.Connection, schema: Schema) -> int:
    """The file's version: its user_version, or, at 0, what `schema.legacy_version` reads in it."""
    version = user_version(conn)
    if version == 0 and schema.legacy_version is not None:
        version = schema.legacy_version(conn)
    return version


def migrate(conn: sqlite3.Connection, schema: Schema, lock: AbstractContextManager[object] | None = None) -> int:
    """Bring the file of a writer's connection to `schema.version`, step by step (see the module
    docstring); `lock` is held throughout. Returns the version the file was at (0: new)."""
    with lock if lock is not None else nullcontext():
        found = stored_version(conn, schema)
        _refuse_newer(conn, schema, found)
        if found == schema.version and user_version(conn) == found:
            return found
        foreign_keys = conn.execute("PRAGMA foreign_keys").fetchone()[0]
        conn.execute("PRAGMA foreign_keys=OFF")  # a no-op inside a transaction: set before the steps
        try:
            version = found
            while True:
                with transaction(conn) as c:
                    version = stored_version(c, schema)  # another process may have gone on meanwhile
                    _refuse_newer(c, schema, version)
                    if version < schema.version:
                        _apply(c, schema, version)
                        version += 1
                    c.execute(f"PRAGMA user_version = {int(version)}")
                if version >= schema.version:
                    return found
        finally:
            if foreign_keys:
                conn.execute("PRAGMA foreign_keys=ON")


def check_version(conn: sqlite3.Connection, schema: Schema) -> int:
    """A reader's check: the file is at `schema.version` (returned), else `NewerSchema` or
    `OlderSchema`. Run it inside the read transaction the queries use, so both see one state."""
    version = stored_version(conn, schema)
    _refuse_newer(conn, schema, version)
    if version < schema.version:
        path = _file(conn)
        if version == 0:
            message = f"{path} holds no {schema.name} yet (schema version 0)"
        else:
            message = (f"{path}: {schema.name} at schema version {version}, older than this kernelrl reads "
                       f"({schema.version}); a kernelrl that opens it for writing brings it up to date")
        raise OlderSchema(message, path=path, schema=schema.name, found=version, supported=schema.version)
    return version


def execute_script(conn: sqlite3.Connection, script: str) -> None:
    """Run the statements of `script` one by one on `conn`, inside the caller's transaction
    (`executescript` would commit first)."""
    for statement in _statements(script):
        conn.execute(statement)


def _apply(conn: sqlite3.Connection, schema: Schema, version: int) -> None:
    step, where = schema.migrations[version], _file(conn)
    try:
        if isinstance(step, str):
            execute_script(conn, step)
        else:
            step(conn)
        if not conn.in_transaction:  # it committed on its own: the step and its version would part
            conn.execute("BEGIN IMMEDIATE")  # for `transaction` to end (nothing is left to roll back)
            raise RuntimeError("the step ended its transaction itself (a COMMIT, or `executescript`)")
    except BaseException as e:
        e.add_note(f"{where}: the {schema.name}'s migration from version {version} to {version + 1} failed; "
                   f"the file stays at version {version} (unless the step committed on its own)")
        raise


def _refuse_newer(conn: sqlite3.Connection, schema: Schema, version: int) -> None:
    if version > schema.version:
        path = _file(conn)
        raise NewerSchema(f"{path}: {schema.name} at schema version {version}, newer than this kernelrl reads "
                          f"({schema.version}); upgrade kernelrl", path=path, schema=schema.name, found=version,
                          supported=schema.version)


def _file(conn: sqlite3.Connection) -> str:
    """The path of the connection's main database file (":memory:" for none), for messages."""
    for _, name, file in conn.execute("PRAGMA database_list").fetchall():
        if name == "main":
            return str(file) or ":memory:"
    return "?"


def _statements(script: str) -> list[str]:
    out, pending = [], ""
    for part in script.split(";"):
        pending += part + ";"
        if sqlite3.complete_statement(pending):  # a ';' in a comment or a string does not end one
            if pending.strip(" \n;"):
                out.append(pending.strip())
            pending = ""
    return out
