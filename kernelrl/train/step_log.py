"""Per-step training metrics in the code database, for the run page (`kernelrl watch`).

The rollouts of a GRPO run are already in the database (each with its step, raw and clipped
reward, kept or not: `kernelrl.train.reward_fn`). What is not there is what only the trainer
knows at a logging step: TRL's own metrics (loss, KL, learning rate, the mean reward, lengths)
and the curriculum's per-task weights. `step_log_callback(db, run_id=..., curriculum=...)` is a
TRL/transformers `TrainerCallback` that writes both, one row per logging step, into the table
`train_steps` of the same SQLite file:

    train_steps(run_id, step, logged, metrics JSON, weights JSON, open_levels JSON)

Registration in `kernelrl.train.grpo.train_grpo` (the trainer's callbacks list):

    callbacks=[state_callback(reward_fn), probe, step_log_callback(db, run_id=run_id, curriculum=curriculum)]

Guarantees: only the main process writes (`state.is_world_process_zero`); each row is one
committed transaction on its own connection (SQLite serialises it with the database's writer);
a step logged again (TRL's summary at the last step, a resumed run) adds its metrics to the
row, later values winning, and replaces the weights; only finite
numbers are kept from TRL's logs (strings, None and NaN are dropped, so the JSON is valid);
the table is created when missing, and reading a file without it gives no rows.

Does not guarantee: that a write never fails (a locked file past the 30 s busy timeout raises,
as any database write of the trainer would); per-rollout numbers (those are the candidates').
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLE = "train_steps"
_CREATE = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    run_id INTEGER NOT NULL,
    step INTEGER NOT NULL,
    logged REAL NOT NULL,
    metrics TEXT NOT NULL,
    weights TEXT NOT NULL,
    open_levels TEXT NOT NULL,
    PRIMARY KEY (run_id, step)
)
"""


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One logging step of a training run."""

    run_id: int
    step: int
    logged: float  # seconds since the epoch
    metrics: dict[str, float]  # TRL's logs at this step (loss, reward, kl, kernelrl/raw_reward, ...)
    weights: dict[str, float]  # task -> curriculum weight of its next draw (0: its level is not open yet)
    open_levels: tuple[int, ...]


def curriculum_weights(curriculum: Any) -> tuple[dict[str, float], tuple[int, ...]]:
    """(task -> weight of its next draw, open levels); a task of a level not yet open weighs 0."""
    if curriculum is None:
        return {}, ()
    open_names = {t.name for t in curriculum.open_tasks()}
    weights = {name: (float(curriculum.weight(name)) if name in open_names else 0.0)
               for name in sorted(curriculum.tasks)}
    return weights, tuple(int(x) for x in curriculum.open_levels)


def finite_numbers(logs: dict[str, Any] | None) -> dict[str, float]:
    """The finite numbers of a logs dict (bools and strings dropped)."""
    out: dict[str, float] = {}
    for key, value in (logs or {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[str(key)] = float(value)
    return out


def write_step(db_path: str | Path, record: StepRecord) -> None:
    """Store one step; a second write of the same run and step adds its metrics to the row (the
    later value of a metric wins) and replaces its weights."""
    conn = sqlite3.connect(Path(db_path), timeout=30.0, isolation_level=None)
    try:
        conn.execute(_CREATE)
        conn.execute("BEGIN IMMEDIATE")
        try:
            # TRL logs twice at the last step (its metrics, then the run's summary): keep both.
            row = conn.execute(f"SELECT metrics FROM {TABLE} WHERE run_id = ? AND step = ?",
                               (record.run_id, record.step)).fetchone()
            metrics = {**(json.loads(row[0]) if row else {}), **record.metrics}
            conn.execute(f"INSERT OR REPLACE INTO {TABLE} (run_id, step, logged, metrics, weights, open_levels) "
                         "VALUES (?, ?, ?, ?, ?, ?)",
                         (record.run_id, record.step, record.logged, json.dumps(metrics, sort_keys=True),
                          json.dumps(record.weights, sort_keys=True), json.dumps(list(record.open_levels))))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    finally:
        conn.close()


def read_steps(conn: sqlite3.Connection, run_id: int) -> list[StepRecord]:
    """A run's logged steps in order, through an open connection (none when the table is missing)."""
    have = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone()
    if not have:
        return []
    rows = conn.execute(f"SELECT run_id, step, logged, metrics, weights, open_levels FROM {TABLE} "
                        "WHERE run_id = ? ORDER BY step", (run_id,)).fetchall()
    return [StepRecord(run_id=r[0], step=r[1], logged=r[2], metrics=json.loads(r[3]), weights=json.loads(r[4]),
                       open_levels=tuple(json.loads(r[5]))) for r in rows]


def step_log_callback(db: Any, *, run_id: int | None, curriculum: Any = None) -> Any:
    """A `TrainerCallback` writing each logging step to `db`'s file (a `Database` or a path).

    With no database or no run id it records nothing (the trainer runs without one in tests).
    """
    from transformers import TrainerCallback

    path = getattr(db, "path", db)

    class StepLog(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kwargs: Any) -> Any:
            if path is None or run_id is None or not state.is_world_process_zero:
                return control
            metrics = finite_numbers(logs)
            if not metrics:
                return control
            weights, levels = curriculum_weights(curriculum)
            write_step(path, StepRecord(run_id=int(run_id), step=int(state.global_step), logged=time.time(),
                                        metrics=metrics, weights=weights, open_levels=levels))
            return control

    return StepLog()
