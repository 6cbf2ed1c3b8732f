"""A run database's tasks and their measured baselines.

Guarantees: a task's row holds the hash its verdicts are stored against (`Task.identity_hash`: its
source and size presets; the column was `source_hash` before schema version 5), and a caller
holding a `Task` registers it through `register_task`, which cannot pass another hash; a row is
written again whole when a task is registered again. A baseline is one row per (task, device,
size), its times checked positive before it is written, replaced by a later measurement.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kernelrl.store.connection import Connection
from kernelrl.store.records import BaselineRecord, TaskRecord

if TYPE_CHECKING:
    from kernelrl.tasks.task import Task

_BASELINE_COLS = "task, device, size, eager_ms, compile_ms, measured, compile_ci_lo, compile_ci_hi"


class TaskRows(Connection):
    """The `tasks` and `baselines` tables of a `Database`."""

    def register_task(self, task: Task, *, size: str) -> None:
        """The task's row, under the hash its verdicts are stored against (`Task.identity_hash`: the
        source and its size presets): what every caller holding a task uses."""
        self.upsert_task(name=task.name, source=task.source, identity_hash=task.identity_hash, level=task.level,
                         size=size)

    def upsert_task(self, *, name: str, source: str, identity_hash: str, level: int | None, size: str) -> None:
        """A task row as given (`identity_hash`: `Task.identity_hash`, what verdicts are stored
        against): for rows made by hand, such as a test's edge cases; a caller with a `Task` uses
        `register_task`, which cannot pass another hash."""
        with self._tx() as c:
            c.execute("INSERT INTO tasks (name, source, identity_hash, level, size) VALUES (?, ?, ?, ?, ?) "
                      "ON CONFLICT(name) DO UPDATE SET source=excluded.source, identity_hash=excluded.identity_hash, "
                      "level=excluded.level, size=excluded.size", (name, source, identity_hash, level, size))

    def tasks(self) -> list[TaskRecord]:
        return [TaskRecord(name=r[0], source=r[1], identity_hash=r[2], level=r[3], size=r[4])
                for r in self._query("SELECT name, source, identity_hash, level, size FROM tasks ORDER BY name")]

    def put_baseline(self, *, task: str, device: str, size: str, eager_ms: float, compile_ms: float | None,
                     compile_ci: tuple[float, float] | None = None) -> None:
        if not eager_ms > 0:
            raise ValueError(f"eager_ms must be > 0, got {eager_ms}")
        if compile_ms is not None and not compile_ms > 0:
            raise ValueError(f"compile_ms must be > 0 or None, got {compile_ms}")
        with self._tx() as c:
            lo, hi = compile_ci if compile_ci is not None and compile_ms is not None else (None, None)
            c.execute("INSERT OR REPLACE INTO baselines (task, device, size, eager_ms, compile_ms, measured, "
                      "compile_ci_lo, compile_ci_hi) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                      (task, device, size, eager_ms, compile_ms, time.time(), lo, hi))

    def get_baseline(self, task: str, device: str, size: str) -> BaselineRecord | None:
        rows = self._query(f"SELECT {_BASELINE_COLS} FROM baselines WHERE task = ? AND device = ? AND size = ?",
                           (task, device, size))
        return _baseline(rows[0]) if rows else None

    def baselines(self) -> list[BaselineRecord]:
        return [_baseline(r) for r in self._query(f"SELECT {_BASELINE_COLS} FROM baselines ORDER BY task")]


def _baseline(r: tuple[Any, ...]) -> BaselineRecord:
    ci = (float(r[6]), float(r[7])) if r[6] is not None and r[7] is not None else None
    return BaselineRecord(task=r[0], device=r[1], size=r[2], eager_ms=r[3], compile_ms=r[4], measured=r[5],
                          compile_ci=ci)
