"""Why was this paid that: completions scored the way GRPO training scores them, every step shown.

`explain(...)` takes a run database, a task, the versions a prompt showed (their ids in that
database, or a prompt row as training stored it: a GRPO rollout, whose meta lists the ids) and
completions, and returns for each what training would pay and why. It goes through training's own
parts, not a copy of them:

- the scorer (`kernelrl.train.scorer.Scorer`): the judge's verdict (a source judged before under
  the same evaluator settings reuses its stored verdict, as in training), the copy rule against the
  shown versions' full sources, the raw reward and its parts;
- the batch shaper (`kernelrl.train.shaper.shape_batch`): the completions as one group, clipped to
  the band of the task's window before them; GRPO-RoC is not applied (it chooses within a sampled
  group, which a handful of completions is not).

The window is the training run's: the raw rewards its GRPO rollouts of the task stored (newest
last, as many as the window holds; the level's while the task's is short), or the windows of a
checkpoint's state file when one is given (`kernelrl_state.rank0.json`: exact at that step).

Guarantees: nothing is written to the database; bad input (an unknown id, an id of another task,
a task the database does not hold or holds another version of) is an `ExplainError` with one line.

Does not train or sample.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelrl.result import EvalResult
from kernelrl.reward import RewardModel, Windows
from kernelrl.store.records import RunStage
from kernelrl.tasks.task import Task
from kernelrl.train.copies import CopyFinding, CopyRule
from kernelrl.train.roc import RoCConfig
from kernelrl.train.rollouts import EvalSettings, Rollout
from kernelrl.train.scorer import Exclusion, Scorer
from kernelrl.train.shaper import shape_batch

if TYPE_CHECKING:
    from kernelrl.judge.contract import ProfilingJudge
    from kernelrl.store import Database


class ExplainError(ValueError):
    """Bad input to `explain`: one line, naming what is wrong."""


@dataclass(frozen=True, kw_only=True)
class Explained:
    """One completion: its verdict, and each step from it to what training pays."""

    label: str
    result: EvalResult | None  # None: the answer held no code
    reused_from: int | None  # the candidate whose stored verdict was reused
    raw: float | None
    parts: dict[str, float]
    within_noise: bool
    copy: CopyFinding | None
    band: tuple[float, float] | None
    clipped: bool
    value: float | None  # what training pays; None: nothing (see `excluded`)
    excluded: Exclusion | None

    def to_dict(self) -> dict[str, Any]:
        r = self.result
        return {"completion": self.label, "status": r.status.value if r else "no_code",
                "speedup": r.speedup if r else None, "speedup_ci": list(r.speedup_ci) if r and r.speedup_ci else None,
                "message": r.message if r else "", "reused_from": self.reused_from, "raw": self.raw,
                "parts": self.parts, "within_noise": self.within_noise,
                "copy": self.copy.to_dict() if self.copy else None, "band": list(self.band) if self.band else None,
                "clipped": self.clipped, "value": self.value,
                "excluded": self.excluded.value if self.excluded else None}


@dataclass(frozen=True, kw_only=True)
class Prompted:
    """What a prompt showed: the task and the ids of its versions (or its text, without ids)."""

    task: Task
    shown: tuple[int, ...] | None
    prompt: str


def prompted(db: Database, *, task: Task | None, shown: Sequence[int] | None, prompt_row: int | None) -> Prompted:
    """The task and shown versions of `--shown` ids or a stored prompt row, checked against the database."""
    if (shown is None) == (prompt_row is None):
        raise ExplainError("give the versions the prompt showed (their ids) or a prompt row, one of the two")
    if prompt_row is not None:
        row = db.get_candidate(prompt_row)
        if row is None:
            raise ExplainError(f"no candidate {prompt_row} in this database")
        if task is not None and task.name != row.task:
            raise ExplainError(f"candidate {prompt_row} is a rollout of {row.task!r}, not of {task.name!r}")
        return Prompted(task=task or task_of(db, row.task), shown=row.meta.shown, prompt=row.prompt)
    ids = tuple(int(i) for i in shown or ())
    names = set()
    for i in ids:
        rec = db.get_candidate(i)
        if rec is None:
            raise ExplainError(f"no candidate {i} in this database")
        names.add(rec.task)
    if len(names) > 1:
        raise ExplainError(f"the shown versions belong to several tasks ({', '.join(sorted(names))}); a prompt shows one's")
    name = names.pop() if names else (task.name if task else None)
    if name is None:
        raise ExplainError("no shown version and no task: name the task")
    if task is not None and task.name != name:
        raise ExplainError(f"the shown versions are versions of {name!r}, not of {task.name!r}")
    return Prompted(task=task or task_of(db, name), shown=ids, prompt="")


def task_of(db: Database, name: str) -> Task:
    """The task as the database holds it (its source and level)."""
    for rec in db.tasks():
        if rec.name == name:
            return Task(name=rec.name, source=rec.source, level=rec.level)
    raise ExplainError(f"this database holds no task {name!r}")


def check_task(db: Database, task: Task) -> None:
    """The database holds `task`, the same version of it."""
    held = {rec.name: rec for rec in db.tasks()}
    rec = held.get(task.name)
    if rec is None:
        raise ExplainError(f"this database holds no task {task.name!r} (it holds {', '.join(sorted(held)) or 'none'})")
    if rec.identity_hash not in (task.identity_hash, task.source_hash):
        raise ExplainError(f"this database holds another version of {task.name!r} (its source differs)")


def run_windows(db: Database, task: Task, size: int) -> Windows:
    """The clip windows as the run left them: the raw rewards its GRPO rollouts stored for correct,
    timed results, per task and per level, newest last."""
    levels = {rec.name: rec.level for rec in db.tasks()}
    by_task: dict[str, list[float]] = {}
    by_level: dict[int | None, list[float]] = {}
    for c in db.candidates():
        m = c.meta
        if m.stage is not RunStage.GRPO or m.raw is None or c.result is None or c.result.speedup is None:
            continue
        by_task.setdefault(c.task, []).append(m.raw)
        by_level.setdefault(levels.get(c.task), []).append(m.raw)
    return Windows(by_task={k: tuple(v[-size:]) for k, v in by_task.items()},
                   by_level={k: tuple(v[-size:]) for k, v in by_level.items()})


def state_windows(path: Path, model: RewardModel) -> Windows:
    """The windows a checkpoint's kernelrl state file holds."""
    try:
        saved = json.loads(Path(path).read_text())
        model.load_state(saved.get("reward") or {})
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise ExplainError(f"{path}: not a kernelrl state file ({e})") from e
    return model.windows


def explain(db: Database, at: Prompted, completions: Sequence[tuple[str, str]], *, judge: ProfilingJudge,
            reward: RewardModel, settings: EvalSettings, copy_rule: CopyRule | None = None,
            windows: Windows | None = None) -> list[Explained]:
    """What training would pay each (label, answer) completion on the prompt `at`, and why."""
    check_task(db, at.task)
    scorer = Scorer(judge, tasks={at.task.name: at.task}, reward=reward, db=db, reuse=settings, copy_rule=copy_rule)
    rollouts = [Rollout(task=at.task.name, prompt=at.prompt, answer=text, shown=at.shown) for _, text in completions]
    try:
        judged = scorer.judge(rollouts)
        scored = scorer.score(judged, ["explain"] * len(rollouts))
    except ValueError as e:  # a shown id that is not a version of the task
        raise ExplainError(str(e)) from e
    shaped = shape_batch(scored, step=0, group_size=None, windows=windows if windows is not None else Windows(),
                         smoothing=reward.config.smoothing, roc=RoCConfig(enabled=False),
                         rng_state=random.Random(0).getstate())
    out = []
    for (label, _), j, s, r, value, why in zip(completions, judged, scored, shaped.rewards, shaped.values,
                                                shaped.excluded):
        out.append(Explained(label=label, result=j.result, reused_from=j.reused_from,
                             raw=r.raw if r is not None else None, parts=dict(r.parts) if r is not None else {},
                             within_noise=bool(r and r.within_noise), copy=s.copy, band=r.band if r else None,
                             clipped=bool(r and r.clipped), value=value, excluded=why))
    return out
