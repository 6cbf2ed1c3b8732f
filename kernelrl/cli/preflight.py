"""Checks a command makes before it starts anything: every mistake found while it is still cheap.

Each check raises `UsageError` with one line in the user's words (the flag, the file, the name
given), never a class name; a command calls them all before it starts a worker, loads a model or
opens a server, so a typo costs a second, not a minute of start-up (config refusals are put in the
flags' words by `kernelrl.cli.flags.user_words`).

Guarantees: no check starts a process, imports torch, loads a model or writes a file; a database
is opened read-only (SQLite `mode=ro`), a port is bound and released at once.
Does not replace the components' own validation: it runs first, so its messages are the ones seen.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kernelrl.cli.options import UsageError

if TYPE_CHECKING:
    from kernelrl.tasks.task import Task
    from kernelrl.web.config import WatchConfig


def check_tasks(specs: Sequence[str], *, flag: str = "--tasks") -> list[Task]:
    """The tasks of these specs (suites, task names, files, folders), loaded; an unknown one is named
    as the user would call it (a suite where it looks like one)."""
    from kernelrl.tasks.suites import load_tasks
    from kernelrl.tasks.task import TaskError

    if not specs:
        raise UsageError(f"{flag}: no task given (a suite such as builtin or small, a task name, a file or a folder)")
    try:
        tasks = load_tasks(list(specs))
    except TaskError as e:
        raise UsageError(f"{flag}: {e}") from e
    if not tasks:
        raise UsageError(f"{flag} {' '.join(specs)}: no tasks found")
    names = [t.name for t in tasks]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"{flag}: two different tasks are both named {twice[0]} (rename one file)")
    return tasks


def check_suite(spec: str) -> list[Task]:
    """`kernelrl tasks --suite SPEC`: a suite, a folder, a task file or a task name."""
    from kernelrl.tasks.suites import load_tasks, suite_names
    from kernelrl.tasks.task import TaskError

    try:
        return load_tasks(spec)
    except TaskError as e:
        unknown = [s.strip() for s in spec.split(",") if s.strip() and s.strip() not in suite_names()
                   and not Path(s.strip()).exists()]
        if unknown and str(e).startswith("unknown task"):
            import difflib

            close = difflib.get_close_matches(unknown[0], list(suite_names()), n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UsageError(f"--suite: unknown suite {unknown[0]!r}{hint}; known suites: {', '.join(suite_names())} "
                             "(or a folder of task files, a task file or a task name)") from e
        raise UsageError(f"--suite: {e}") from e


def check_proposer(spec: str, opts: Mapping[str, object] | None = None, *, flag: str = "--proposer") -> None:
    """The proposer spec names a known kind with options it takes, and any file it names exists;
    nothing is loaded or called."""
    from kernelrl.proposers import ProposerError, check_spec

    try:
        check_spec(spec, **dict(opts or {}))
    except ProposerError as e:
        raise UsageError(f"{flag} {spec}: {e}") from e


def check_run_database(path: str | Path, *, flag: str = "--db") -> Path:
    """An existing file that is a kernelrl run database (opened read-only)."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{flag} {p}: no such file")
    if not p.is_file():
        raise UsageError(f"{flag} {p} is not a file")
    from kernelrl.store.schema import is_run_database  # the run database's tables are its owner's

    if not is_run_database(p):
        raise UsageError(f"{flag} {p}: not a kernelrl run database (no runs in it; `kernelrl optimize --db` makes one)")
    return p


def check_new_database(path: str | Path, *, resume: bool, flag: str = "--db") -> None:
    """The run database of `optimize`: with `--resume` an existing run database; otherwise a new
    file in a writable folder, or an existing run database (a new run is added to it)."""
    p = Path(path)
    if resume:
        if not p.exists():
            raise UsageError(f"--resume: {p} does not exist, so there is no run to continue "
                             f"(leave out --resume to start one)")
        check_run_database(p, flag=flag)
        return
    if p.exists():
        check_run_database(p, flag=flag)
        return
    check_writable_parent(p, flag=flag)


def check_writable_parent(path: str | Path, *, flag: str) -> None:
    """A file can be created at `path`: its nearest existing folder is a writable folder."""
    p = Path(path)
    if p.exists() and p.is_dir():
        raise UsageError(f"{flag} {p}: is a folder, not a file")
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {p}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {p}: cannot write in {parent}")


def check_files(paths: Iterable[tuple[str, str | Path | None]], *, folder: bool = False) -> None:
    """Each (flag, path) given names an existing file (or folder)."""
    for flag, path in paths:
        if path is None:
            continue
        p = Path(path)
        if folder and not p.is_dir():
            raise UsageError(f"{flag} {p}: no such folder")
        if not folder and not p.is_file():
            raise UsageError(f"{flag} {p}: no such file")


def check_watch(watch: WatchConfig) -> None:
    """A run page asked for (`--watch.port`) can listen where it is asked to, checked before the run starts."""
    if watch.port is not None:
        check_port(watch.host, watch.port, flag="--watch.port")


def check_port(host: str, port: int, *, flag: str = "--port") -> None:
    """`port` is in range and free on `host` now (bound and released at once; 0: any port)."""
    if not 0 <= port <= 65535:
        raise UsageError(f"{flag} must be in 0-65535, got {port}")
    if port == 0:
        return
    from kernelrl.web.app import bind  # how every server of kernelrl listens

    try:
        bind(host, port).close()
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}"
                         + (" (another program holds it; pick another --port, or 0 for any)"
                            if e.errno in (98, 48) else "")) from e
