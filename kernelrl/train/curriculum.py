"""Which task the next GRPO prompt is about: curriculum by level, difficulty-aware resampling.

- By level: training starts on the lowest level of the run's tasks; the next level opens when
  `promote_solved` of the tasks of the highest open level have had a correct sample, or after
  `promote_after` draws at the current levels (whichever comes first). `by_level = false` opens
  every level at once.
- Difficulty-aware resampling: a task whose last group had zero reward variance (no signal) or
  no correct sample is drawn with weight `resample_weight` instead of 1 for its next draws, so
  the gradient goes where the model is not yet right; after `max_resamples` such groups in a
  row it weighs 1 again, so a task the model cannot solve yet does not eat the run.

Guarantees: draws are reproducible from the seed and the observations; `state()` and
`load_state()` carry everything across a checkpoint; safe to call from several threads.

Does not build prompts (`kernelrl.train.stream` does) and does not score (the reward function
reports what it saw through `observe`).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kernelrl.tasks.task import Task


@dataclass(frozen=True, kw_only=True)
class CurriculumConfig:
    by_level: bool = True  # open the task levels one at a time (false: every level from the start)
    promote_solved: float = 0.5  # share of the highest open level's tasks with a correct sample
    promote_after: int | None = None  # draws at the current levels after which the next opens anyway
    resample: bool = True  # draw a task whose groups were flat or unsolved again sooner
    resample_weight: float = 3.0  # its draw weight meanwhile (every other task weighs 1)
    max_resamples: int = 3  # boosted draws in a row for one task

    def __post_init__(self) -> None:
        if not 0 < self.promote_solved <= 1:
            raise ValueError("curriculum.promote_solved must be in (0, 1]")
        if self.promote_after is not None and self.promote_after < 1:
            raise ValueError("curriculum.promote_after must be >= 1 or unset")
        if self.resample_weight < 1:
            raise ValueError("curriculum.resample_weight must be >= 1")
        if self.max_resamples < 0:
            raise ValueError("curriculum.max_resamples must be >= 0")


def level_of(task: Task) -> int:
    return task.level if task.level is not None else 1


class Curriculum:
    def __init__(self, tasks: Sequence[Task], config: CurriculumConfig | None = None, *, seed: int = 0) -> None:
        if not tasks:
            raise ValueError("a curriculum needs at least one task")
        self.config = config or CurriculumConfig()
        self.tasks = {t.name: t for t in tasks}
        self.levels = sorted({level_of(t) for t in tasks})
        self._open = 1 if self.config.by_level else len(self.levels)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._solved: set[str] = set()
        self._streak: dict[str, int] = {}  # uninformative groups in a row
        self._draws_at_level = 0
        self.draws = 0

    @property
    def open_levels(self) -> tuple[int, ...]:
        return tuple(self.levels[: self._open])

    def open_tasks(self) -> list[Task]:
        levels = set(self.open_levels)
        return [t for t in self.tasks.values() if level_of(t) in levels]

    def weight(self, name: str) -> float:
        cfg = self.config
        streak = self._streak.get(name, 0)
        return cfg.resample_weight if cfg.resample and 0 < streak <= cfg.max_resamples else 1.0

    def draw(self) -> Task:
        with self._lock:
            tasks = self.open_tasks()
            task = self._rng.choices(tasks, weights=[self.weight(t.name) for t in tasks])[0]
            self.draws += 1
            self._draws_at_level += 1
            self._maybe_promote()
            return task

    def observe(self, task: str, values: Sequence[float], *, any_correct: bool) -> None:
        """One group's rewards: zero spread or no correct sample makes the task come back sooner."""
        if task not in self.tasks:
            return
        with self._lock:
            if any_correct:
                self._solved.add(task)
            flat = len(values) < 2 or max(values) - min(values) < 1e-9
            if flat or not any_correct:
                self._streak[task] = self._streak.get(task, 0) + 1
            else:
                self._streak.pop(task, None)
            self._maybe_promote()

    def _maybe_promote(self) -> None:
        cfg = self.config
        if self._open >= len(self.levels):
            return
        top = self.levels[self._open - 1]
        at_top = [n for n, t in self.tasks.items() if level_of(t) == top]
        solved = sum(1 for n in at_top if n in self._solved) / len(at_top)
        waited = cfg.promote_after is not None and self._draws_at_level >= cfg.promote_after
        if solved >= cfg.promote_solved or waited:
            self._open += 1
            self._draws_at_level = 0

    def state(self) -> dict[str, object]:
        with self._lock:
            return {"open": self._open, "solved": sorted(self._solved), "streak": dict(self._streak),
                    "draws": self.draws, "draws_at_level": self._draws_at_level, "rng": _rng_state(self._rng)}

    def load_state(self, state: dict[str, Any]) -> None:
        with self._lock:
            self._open = max(1, min(int(state.get("open", 1)), len(self.levels)))
            self._solved = {n for n in state.get("solved", []) if n in self.tasks}
            self._streak = {n: int(v) for n, v in state.get("streak", {}).items() if n in self.tasks}
            self.draws = int(state.get("draws", 0))
            self._draws_at_level = int(state.get("draws_at_level", 0))
            if "rng" in state:
                version, internal, gauss = state["rng"]
                self._rng.setstate((version, tuple(internal), gauss))


def _rng_state(rng: random.Random) -> list[int | list[int] | float | None]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]
