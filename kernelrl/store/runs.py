"""A run database's runs and their training step log.

Guarantees: a run's row is written `running` with its config (JSON, keys sorted) and closed with
its status and end time, each in one transaction; rows are written and closed only by the run's
builder (`kernelrl.run_parts.build_run`), which also reopens one on resume (`reopen_run`: running
again, under the config it continues with). Each training step is one transaction through the
same connection and lock (`kernelrl.store.steps` owns its table).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from kernelrl.store import steps
from kernelrl.store.connection import Connection
from kernelrl.store.records import RunRecord, RunStatus

_RUN_COLS = "id, config, started, finished, status"


class RunRows(Connection):
    """The `runs` table and the training step log of a `Database`."""

    def start_run(self, config: Mapping[str, object]) -> int:
        with self._tx() as c:
            cur = c.execute("INSERT INTO runs (config, started, status) VALUES (?, ?, ?)",
                            (json.dumps(config, sort_keys=True, default=str), time.time(), RunStatus.RUNNING.value))
            return int(cur.lastrowid or 0)

    def finish_run(self, run_id: int, status: RunStatus) -> None:
        with self._tx() as c:
            c.execute("UPDATE runs SET status = ?, finished = ? WHERE id = ?", (status.value, time.time(), run_id))

    def reopen_run(self, run_id: int, config: Mapping[str, object]) -> None:
        """Mark a run as running again (resume), with the config it now continues under."""
        with self._tx() as c:
            c.execute("UPDATE runs SET status = ?, finished = NULL, config = ? WHERE id = ?",
                      (RunStatus.RUNNING.value, json.dumps(config, sort_keys=True, default=str), run_id))

    def runs(self) -> list[RunRecord]:
        return [_run(r) for r in self._query(f"SELECT {_RUN_COLS} FROM runs ORDER BY id")]

    def get_run(self, run_id: int) -> RunRecord | None:
        rows = self._query(f"SELECT {_RUN_COLS} FROM runs WHERE id = ?", (run_id,))
        return _run(rows[0]) if rows else None

    def latest_run(self) -> RunRecord | None:
        rows = self._query(f"SELECT {_RUN_COLS} FROM runs ORDER BY id DESC LIMIT 1")
        return _run(rows[0]) if rows else None

    def log_step(self, record: steps.StepRecord) -> None:
        """Store one logging step of a training run (`steps.write`), in one transaction."""
        with self._tx() as c:
            steps.write(c, record)

    def train_steps(self, run_id: int) -> list[steps.StepRecord]:
        """A run's logged training steps in order (none when nothing was logged)."""
        with self._lock:
            return steps.read(self._conn, run_id)


def _run(r: tuple[Any, ...]) -> RunRecord:
    return RunRecord(id=r[0], config=json.loads(r[1]), started=r[2], finished=r[3], status=RunStatus(r[4]))
