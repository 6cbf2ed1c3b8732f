"""Per-step training metrics in the run database, for the run page (`kernelrl watch`).

The rollouts of a GRPO run are already in the database (each with its step, raw and clipped
reward, kept or not: `kernelrl.train.reward_fn`). What is not there is what only the trainer
knows at a logging step: TRL's own metrics (loss, KL, learning rate, the mean reward, lengths)
and the curriculum's per-task weights. `step_log_callback(db, run_id=..., curriculum=...)` is a
TRL/transformers `TrainerCallback` that hands both, one record per logging step, to the run
database (`Database.log_step`; the table and its merge rule are `kernelrl.store.steps`).

Registration in `kernelrl.train.grpo.train_grpo` (the trainer's callbacks list):

    callbacks=[state_callback(reward_fn), probe, step_log_callback(db, run_id=run_id, curriculum=curriculum)]

Guarantees: only the main process writes (`state.is_world_process_zero`); each step is one
committed transaction of the database's own writer (its connection and lock); only finite
numbers are kept from TRL's logs (strings, None and NaN are dropped, so the JSON is valid).

Does not guarantee: that a write never fails (a locked file past the 30 s busy timeout raises,
as any database write of the trainer would); per-rollout numbers (those are the candidates').
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from kernelrl.store import Database
from kernelrl.store.steps import StepRecord

if TYPE_CHECKING:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

    from kernelrl.train.curriculum import Curriculum


def curriculum_weights(curriculum: Curriculum | None) -> tuple[dict[str, float], tuple[int, ...]]:
    """(task -> weight of its next draw, open levels); a task of a level not yet open weighs 0."""
    if curriculum is None:
        return {}, ()
    open_names = {t.name for t in curriculum.open_tasks()}
    weights = {name: (float(curriculum.weight(name)) if name in open_names else 0.0)
               for name in sorted(curriculum.tasks)}
    return weights, tuple(int(x) for x in curriculum.open_levels)


def finite_numbers(logs: Mapping[str, object] | None) -> dict[str, float]:
    """The finite numbers of a logs dict (bools and strings dropped)."""
    out: dict[str, float] = {}
    for key, value in (logs or {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[str(key)] = float(value)
    return out


def step_log_callback(db: Database | None, *, run_id: int | None, curriculum: Curriculum | None = None) -> TrainerCallback:
    """A `TrainerCallback` writing each logging step to the run database `db`.

    With no database or no run id it records nothing (the trainer runs without one in tests).
    """
    from transformers import TrainerCallback

    class StepLog(TrainerCallback):
        def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                   logs: Mapping[str, object] | None = None, **kwargs: object) -> TrainerControl:
            if db is None or run_id is None or not state.is_world_process_zero:
                return control
            metrics = finite_numbers(logs)
            if not metrics:
                return control
            weights, levels = curriculum_weights(curriculum)
            db.log_step(StepRecord(run_id=int(run_id), step=int(state.global_step), logged=time.time(),
                                   metrics=metrics, weights=weights, open_levels=levels))
            return control

    return StepLog()
