"""What a shaped batch leaves behind: the code database, the curriculum, the logs.

`RolloutEffects.apply(batch)` runs once per reward call, after the batch is scored and shaped:

- **database**: this rank's rollouts, their verdicts and what training did with them (raw and
  trained-on reward, band, kept, why excluded, copy of which version, the versions the prompt
  showed, step, rank and group) in each candidate's `meta`; flagged ones land in the hack-case
  table. Written in the reward call itself, not at the step's end: a step that fails after judging
  keeps every judged rollout, and the prompts built next (one generation batch ahead) show them;
- **curriculum**: each group of the global batch observed once, from its trained-on rewards (the
  same on every rank; only the main process's curriculum draws);
- **logs**: TRL's metrics over the global batch (`kernelrl/...`, `kernelrl/excluded/<why>`: the
  step log stores them), its completions table (verdict, raw and trained-on reward of this
  rank's rows), one console line per call, and with several ranks one line naming every group.

Does not score or shape (`kernelrl.train.scorer`, `kernelrl.train.shaper`): a pure shaper and a
scorer shared with `kernelrl reward` leave the state changes here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kernelrl.result import EvalResult, Status
from kernelrl.reward import Reward
from kernelrl.run_parts import Reporter
from kernelrl.store.records import RunMeta, RunStage
from kernelrl.train.curriculum import Curriculum
from kernelrl.train.rollouts import EvalSettings, Judged, store_rollouts
from kernelrl.train.scorer import Exclusion, Scored
from kernelrl.train.shaper import Shaped

if TYPE_CHECKING:
    from rich.console import Console

    from kernelrl.store import Database

# What TRL passes a reward function to log with: a scalar metric, and a column of the completions table.
LogMetric = Callable[[str, float], object]
LogExtra = Callable[[str, list[object]], object]

log = logging.getLogger("kernelrl.train.reward")


@dataclass(frozen=True, kw_only=True)
class RolloutLog:
    task: str
    status: Status | None  # None: no code in the answer
    speedup: float | None
    raw: float | None  # None: no reward (task_error, judge_error)
    value: float | None  # what TRL got: clipped, or None (no reward, or dropped by RoC)
    clipped: bool
    kept: bool
    candidate_id: int | None
    reused: bool  # the verdict came from the code database
    group: int = 0  # index of its group in the global batch
    copy: bool = False  # a correct program its prompt showed: paid at most as no speedup
    copy_of: int | None = None
    excluded: Exclusion | None = None


@dataclass(frozen=True, kw_only=True)
class BatchLog:
    """One reward call on this rank: what the evaluator said and what the trainer got."""

    step: int
    rollouts: tuple[RolloutLog, ...]
    evaluated: int  # candidates sent to the backend (reused and code-less ones are not)
    groups: tuple[str, ...] = ()  # every group's task and prompt key in the global batch, in order
    rank: int = 0
    ranks: int = 1
    metrics: dict[str, float] = field(default_factory=dict)  # over the global batch: the same on every rank
    results: tuple[EvalResult | None, ...] = ()  # this rank's verdicts, in order (None: no code)

    @property
    def statuses(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rollouts:
            key = (r.status or Status.NO_CODE).value
            out[key] = out.get(key, 0) + 1
        return out

    @property
    def raws(self) -> list[float]:
        return [r.raw for r in self.rollouts if r.raw is not None]

    @property
    def values(self) -> list[float]:
        return [r.value for r in self.rollouts if r.value is not None]

    @property
    def clipped(self) -> int:
        return sum(r.clipped for r in self.rollouts)


class RolloutEffects:
    """The database, curriculum and logs of a reward function (see the module docstring)."""

    def __init__(self, *, db: Database | None = None, curriculum: Curriculum | None = None, proposer: str = "grpo",
                 reuse: EvalSettings | None = None, run_id: int | None = None,
                 reporter: Reporter | None = None) -> None:
        self.db = db
        self.curriculum = curriculum
        self.proposer = proposer
        self.reuse = reuse
        self.run_id = run_id
        self.reporter = reporter or Reporter.quiet()

    def store(self, judged: Sequence[Judged], shaped: Shaped, here: range, *, step: int,
              rank: int, meta: Sequence[RunMeta] | None = None) -> list[Judged]:
        """This rank's rollouts written with their verdicts and what training did with them."""
        if self.db is None:
            return list(judged)
        group_of = shaped.group_of()
        metas = []
        for n, i in enumerate(here):
            m = _meta(step, shaped.rewards[i], shaped.kept[i], rank=rank, group=group_of[i],
                      excluded=shaped.excluded[i], shown=judged[n].rollout.shown)
            metas.append(m.merged(meta[n]) if meta else m)
        return store_rollouts(self.db, judged, proposer=self.proposer, step=step, run_id=self.run_id,
                              settings=self.reuse, meta=metas)

    def observe(self, every: Sequence[Scored], shaped: Shaped) -> None:
        """Each group of the global batch told to the curriculum once, from its trained-on rewards."""
        if self.curriculum is None:
            return
        for members in shaped.groups:
            values = [v for i in members if (v := shaped.values[i]) is not None]
            self.curriculum.observe(every[members[0]].task, values, any_correct=any(every[i].correct for i in members))

    def report(self, batch: BatchLog, log_metric: LogMetric | None, log_extra: LogExtra | None) -> None:
        if callable(log_metric):
            for name, value in batch.metrics.items():
                log_metric(name, value)
        if callable(log_extra):
            log_extra("verdict", [(r.status or Status.NO_CODE).value for r in batch.rollouts])
            log_extra("raw_reward", [r.raw for r in batch.rollouts])
            log_extra("clipped_reward", [r.value for r in batch.rollouts])
        log.info("step %d rank %d: %s; raw %s; trained on %s; groups %s", batch.step, batch.rank, batch.statuses,
                 [round(x, 3) for x in batch.raws],
                 [None if r.value is None else round(r.value, 3) for r in batch.rollouts], list(batch.groups))
        print_batch(batch, self.reporter.console)
        if batch.ranks > 1:
            self.reporter.console.print(f"groups step {batch.step} rank {batch.rank}/{batch.ranks}: "
                                        + " ".join(f"{g}={name}" for g, name in enumerate(batch.groups)),
                                        highlight=False, soft_wrap=True)


def rollout_log(j: Judged, shaped: Shaped, i: int, group: int) -> RolloutLog:
    r = shaped.rewards[i]
    return RolloutLog(task=j.rollout.task, status=j.status, speedup=j.result.speedup if j.result else None,
                      raw=r.raw if r is not None else None, value=shaped.values[i], clipped=bool(r and r.clipped),
                      kept=shaped.kept[i], candidate_id=j.candidate_id, reused=j.reused_from is not None, group=group,
                      copy=bool(r and r.copy), copy_of=r.copy_of if r is not None else None,
                      excluded=shaped.excluded[i])


def _meta(step: int, reward: Reward | None, kept: bool, *, rank: int, group: int, excluded: Exclusion | None,
          shown: tuple[int, ...] | None) -> RunMeta:
    meta = RunMeta(stage=RunStage.GRPO, step=step, kept=kept, rank=rank, group=group, shown=shown,
                   excluded=excluded.value if excluded is not None else None)
    if reward is None:
        return meta
    return dataclasses.replace(meta, raw=reward.raw, reward=reward.value, clipped=reward.clipped, band=reward.band,
                               within_noise=reward.within_noise, copy=reward.copy, copy_of=reward.copy_of)


def print_batch(batch: BatchLog, console: Console) -> None:
    """One line per reward call: the verdicts, then raw -> clipped rewards (x: dropped by RoC;
    c: a copy of a shown version)."""
    statuses = ", ".join(f"{n} {s}" for s, n in sorted(batch.statuses.items()))
    parts = []
    for r in batch.rollouts:
        if r.raw is None:
            parts.append("none")
            continue
        text = f"{r.raw:+.3f}"
        if r.clipped and r.value is not None:
            text += f"->{r.value:+.3f}"
        if r.copy:
            text += "c"
        if not r.kept:
            text += "x"
        parts.append(text)
    excluded = sum(r.excluded is not None for r in batch.rollouts)
    console.print(f"[bold]reward[/bold] step {batch.step}: {len(batch.rollouts)} rollouts ({statuses}); "
                  f"{batch.evaluated} judged; {batch.clipped} clipped; {excluded} not trained on; "
                  f"raw->clipped: {' '.join(parts)}", highlight=False, soft_wrap=True)
