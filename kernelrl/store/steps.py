"""The training step log's table: per logging step, what only the trainer knows.

The rollouts of a GRPO run are already in the run database (each with its step, raw and clipped
reward, kept or not). What is not there is what only the trainer knows at a logging step: TRL's
own metrics (loss, KL, learning rate, the mean reward, lengths) and the curriculum's per-task
weights. They are one row per logging step of the table `train_steps`
(`kernelrl.store.schema.TRAIN_STEPS`):

    train_steps(run_id, step, logged, metrics JSON, weights JSON, open_levels JSON)

`Database.log_step` writes a row (in one transaction of the database's writer);
`Database.train_steps` and `Snapshot.train_steps` (the watch pages) read a run's rows. The
trainer's callback that produces them is `kernelrl.train.step_log`.

Guarantees: a step logged again (TRL's summary at the last step, a resumed run) adds its metrics
to the row, later values winning, and replaces the weights; the table is created by the first
write, and reading a file without it gives no rows.

Does not filter what it is given (the callback keeps only finite numbers) and does not run a
transaction itself: `write` runs inside its caller's.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from kernelrl.store.schema import TRAIN_STEPS

TABLE = "train_steps"


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One logging step of a training run."""

    run_id: int
    step: int
    logged: float  # seconds since the epoch
    metrics: dict[str, float]  # TRL's logs at this step (loss, reward, kl, kernelrl/raw_reward, ...)
    weights: dict[str, float]  # task -> curriculum weight of its next draw (0: its level is not open yet)
    open_levels: tuple[int, ...]


def write(conn: sqlite3.Connection, record: StepRecord) -> None:
    """Store one step inside the caller's write transaction; a second write of the same run and step
    adds its metrics to the row (the later value of a metric wins) and replaces its weights."""
    conn.execute(TRAIN_STEPS)
    # TRL logs twice at the last step (its metrics, then the run's summary): keep both.
    row = conn.execute(f"SELECT metrics FROM {TABLE} WHERE run_id = ? AND step = ?",
                       (record.run_id, record.step)).fetchone()
    metrics = {**(json.loads(row[0]) if row else {}), **record.metrics}
    conn.execute(f"INSERT OR REPLACE INTO {TABLE} (run_id, step, logged, metrics, weights, open_levels) "
                 "VALUES (?, ?, ?, ?, ?, ?)",
                 (record.run_id, record.step, record.logged, json.dumps(metrics, sort_keys=True),
                  json.dumps(record.weights, sort_keys=True), json.dumps(list(record.open_levels))))


def read(conn: sqlite3.Connection, run_id: int) -> list[StepRecord]:
    """A run's logged steps in order (none when the table is missing)."""
    have = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone()
    if not have:
        return []
    rows = conn.execute(f"SELECT run_id, step, logged, metrics, weights, open_levels FROM {TABLE} "
                        "WHERE run_id = ? ORDER BY step", (run_id,)).fetchall()
    return [StepRecord(run_id=r[0], step=r[1], logged=r[2], metrics=json.loads(r[3]), weights=json.loads(r[4]),
                       open_levels=tuple(json.loads(r[5]))) for r in rows]
