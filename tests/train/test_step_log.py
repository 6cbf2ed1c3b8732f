"""The training step log: the callback writes TRL's logs and the curriculum's weights per step."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelrl.store import Database
from kernelrl.tasks.task import Task
from kernelrl.train.curriculum import Curriculum, CurriculumConfig
from kernelrl.train.step_log import step_log_callback

pytest.importorskip("transformers")


def _task(name: str, level: int) -> Task:
    return Task(name=name, source="x = 1\n", level=level)


def _log(cb, path: Path, step: int, logs: dict, *, main: bool = True) -> None:
    # imported here: transformers' trainer pulls in peft, seconds that collection would pay
    from transformers import TrainerControl, TrainerState, TrainingArguments

    state = TrainerState()
    state.global_step = step
    state.is_world_process_zero = main
    cb.on_log(TrainingArguments(output_dir=str(path.parent / "out"), report_to="none"), state, TrainerControl(),
              logs=logs)


def _rows(path: Path, run_id: int):
    with Database(path, readonly=True) as db:
        return db.train_steps(run_id)


def test_each_logging_step_is_a_row_with_weights(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    with Database(path) as db:
        run = db.start_run({"stage": "grpo"})
        cur = Curriculum([_task("easy", 1), _task("hard", 2)], CurriculumConfig(by_level=True))
        cb = step_log_callback(db, run_id=run, curriculum=cur)
        _log(cb, path, 1, {"loss": 0.5, "kernelrl/raw_reward": -0.2, "note": "text", "nan": float("nan"),
                           "flag": True})
        cur.observe("easy", [0.0, 0.0], any_correct=False)  # flat group: drawn 3x as often next
        _log(cb, path, 2, {"loss": 0.25})
        _log(cb, path, 2, {"loss": 0.2, "train_runtime": 9.0})  # the same step again: merged, later wins
        _log(cb, path, 3, {"loss": 0.1}, main=False)  # another process: not written
        _log(cb, path, 4, {})  # nothing to record
        rows = _rows(path, run)
        assert [r.step for r in rows] == [1, 2]
        assert rows[0].metrics == {"loss": 0.5, "kernelrl/raw_reward": -0.2}  # only finite numbers
        assert rows[0].weights == {"easy": 1.0, "hard": 0.0} and rows[0].open_levels == (1,)
        assert rows[1].weights == {"easy": 3.0, "hard": 0.0} and rows[1].metrics == {"loss": 0.2, "train_runtime": 9.0}
        # the database's own writer goes on: the table sits beside its tables
        assert db.runs()[0].id == run


def test_without_database_or_run_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    _log(step_log_callback(None, run_id=1), path, 1, {"loss": 1.0})
    assert not path.exists()
    with Database(path) as db:
        _log(step_log_callback(db, run_id=None), path, 1, {"loss": 1.0})
    assert _rows(path, 1) == []  # and no table was needed to read that
