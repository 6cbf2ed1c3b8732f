"""The scorer: rollouts in, each one's verdict, copy finding and raw reward out.

One scorer serves training (`kernelrl.train.reward_fn`, single- and multi-turn) and the
`kernelrl reward` command, so what the command explains is what training pays. For a batch of
rollouts on this process:

1. **judge**: each answer's code (the last complete fenced block) is judged by one
   `backend.evaluate_batch` call, or takes the stored verdict of the same source judged before
   under the same evaluator settings (`kernelrl.train.rollouts.evaluate_rollouts`);
2. **copy**: each correct, timed program is compared with the versions its prompt showed, in
   full, from the database (`kernelrl.train.copies`): a version up to edits that change nothing,
   not faster than it beyond noise, is a copy of that version;
3. **raw reward**: `kernelrl.reward.RewardModel.raw` of the verdict (with the task's level, the
   completion's token count and, against torch.compile, the task's eager/compile ratio, measured
   once by the main process and shared); a copy is paid the lower of its measure and no speedup;
   the same program judged on two ranks in one batch is paid by its first verdict on both;
   a verdict with no reward (the task or the judge failed, or the run could not be timed) says why
   (`Exclusion`).

Guarantees: one `Scored` per rollout, in order; never raises for a candidate's or task's fault;
one `evaluate_batch` call per `judge` at most; each shown version's canonical form is made once
per batch.

Does not clip, select or store: the batch shaper (`kernelrl.train.shaper`) clips and selects,
the reward function's effects store (`kernelrl.train.effects`).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kernelrl.candidate import source_hash
from kernelrl.result import EvalResult, Status, Timing
from kernelrl.reward import BaselineKind, Reward, RewardModel
from kernelrl.tasks.task import Task
from kernelrl.train.copies import Comparer, CopyFinding, CopyRule, shown_versions
from kernelrl.train.ranks import Ranks, SingleProcess
from kernelrl.train.roc import problems
from kernelrl.train.rollouts import EvalSettings, Judged, Rollout, evaluate_rollouts

if TYPE_CHECKING:
    from kernelrl.judge.contract import ProfilingJudge
    from kernelrl.store import Database

log = logging.getLogger("kernelrl.train.reward")


class Exclusion(enum.StrEnum):
    """Why a rollout trains on nothing: it has no reward, or a reward TRL is not handed."""

    TASK_ERROR = "task_error"  # the task's reference failed: nothing to pay or punish
    JUDGE_ERROR = "judge_error"  # the judge could not judge (a device not idle, a worker lost)
    UNTIMED = "untimed"  # an interpreted run (Triton on a CPU): no speed to pay
    DROPPED = "dropped"  # GRPO-RoC left it out of its group
    LATER_TURN = "later_turn"  # multi-turn: a later turn of its episode has no reward, so its return has none


def exclusion_of(result: EvalResult | None) -> Exclusion | None:
    """Why a verdict earns no reward (None: it earns one)."""
    if result is None:
        return None
    if result.status is Status.TASK_ERROR:
        return Exclusion.TASK_ERROR
    if result.status is Status.JUDGE_ERROR:
        return Exclusion.JUDGE_ERROR
    if result.timing is Timing.INTERPRETED:
        return Exclusion.UNTIMED
    return None


@dataclass(frozen=True, kw_only=True)
class Scored:
    """One rollout's score as every rank sees it after the gather."""

    rank: int
    task: str
    key: str
    level: int | None
    reward: Reward | None  # raw; None: see `excluded`
    problems: int  # GRPO-RoC's uncleanliness count
    correct: bool
    excluded: Exclusion | None = None  # why `reward` is None
    copy: CopyFinding | None = None


class Scorer:
    """Judges rollouts and gives each its raw reward (see the module docstring)."""

    def __init__(self, backend: ProfilingJudge, *, tasks: Mapping[str, Task], reward: RewardModel,
                 db: Database | None = None, reuse: EvalSettings | None = None, copy_rule: CopyRule | None = None,
                 max_completion_tokens: int | None = None, compile_speedups: Mapping[str, float | None] | None = None,
                 ranks: Ranks | None = None) -> None:
        self.backend = backend
        self.tasks = dict(tasks)
        self.reward = reward
        self.db = db
        self.reuse = reuse
        self.copy_rule = copy_rule or CopyRule()
        self.max_completion_tokens = max_completion_tokens
        self.compile_speedups: dict[str, float | None] = dict(compile_speedups or {})
        self.ranks: Ranks = ranks or SingleProcess()

    def judge(self, rollouts: Sequence[Rollout]) -> list[Judged]:
        """Every rollout's verdict (one evaluate_batch at most), the same program's verdict alike on
        every rank; the compile baselines the batch needs."""
        judged = evaluate_rollouts(self.backend, rollouts, self.tasks, db=self.db, reuse=self.reuse)
        judged = self._share_verdicts(judged)
        self._share_compile_baselines(judged)
        return judged

    def _share_verdicts(self, judged: list[Judged]) -> list[Judged]:
        """With several ranks, a program judged on more than one of them in this batch takes the
        verdict of its first judging in the global batch's order, so identical programs are paid
        identically whatever rank sampled them (each rank judged its own rows; two measurements of
        the same code differ by noise). One gather, called by every rank."""
        if self.ranks.count < 2:
            return judged
        mine = [(i, j.rollout.task, source_hash(j.code or ""), j.result) for i, j in enumerate(judged) if j.judged_here]
        first: dict[tuple[str, str], tuple[int, int, EvalResult | None]] = {}
        for rank, entries in enumerate(self.ranks.gather([mine])):
            for i, task, h, result in entries:
                first.setdefault((task, h), (rank, i, result))
        out = list(judged)
        for i, task, h, _ in mine:
            rank, k, result = first[(task, h)]
            if (rank, k) != (self.ranks.index, i):
                out[i] = dataclasses.replace(judged[i], result=result)
        for i, j in enumerate(judged):  # this rank's own repeats follow the row they repeat
            if j.same_as is not None:
                out[i] = dataclasses.replace(j, result=out[j.same_as].result)
        return out

    def score(self, judged: Sequence[Judged], keys: Sequence[str]) -> list[Scored]:
        """This process's `Scored` rows, in order (rank: this process's)."""
        comparers: dict[tuple[str, tuple[int, ...] | str], Comparer] = {}
        out = []
        for j, key in zip(judged, keys):
            task = self.tasks[j.rollout.task]
            finding = None
            if j.status is Status.CORRECT and j.result is not None and j.result.speedup is not None:
                finding = self._comparer(comparers, task, j.rollout).copy_of(j.code, j.result)
            reward = self.reward.raw(j.result, answer=j.rollout.answer, completion_tokens=j.rollout.completion_tokens,
                                     compile_speedup=self._compile_speedup(task, j), copy=finding is not None)
            if reward is not None and finding is not None:
                reward = dataclasses.replace(reward, copy_of=finding.version)
            out.append(Scored(rank=self.ranks.index, task=task.name, key=key, level=task.level, reward=reward,
                              problems=problems(j.rollout.answer, j.result, truncated=self._truncated(j)),
                              correct=j.status is Status.CORRECT,
                              excluded=exclusion_of(j.result) if reward is None else None, copy=finding))
        return out

    def _comparer(self, cache: dict[tuple[str, tuple[int, ...] | str], Comparer], task: Task,
                  rollout: Rollout) -> Comparer:
        """The versions a rollout's prompt showed, compared against (one per prompt in a batch)."""
        text = rollout.shown_text if rollout.shown_text is not None else rollout.prompt
        key: tuple[str, tuple[int, ...] | str] = (task.name, rollout.shown if rollout.shown is not None else text)
        if key not in cache:  # recorded ids first, else the prompt's blocks (`shown_versions`)
            cache[key] = Comparer(shown_versions(self.db, task, ids=rollout.shown, prompt=text), self.copy_rule)
        return cache[key]

    def _truncated(self, j: Judged) -> bool:
        n = j.rollout.completion_tokens
        return self.max_completion_tokens is not None and n is not None and n >= self.max_completion_tokens

    def _share_compile_baselines(self, judged: Sequence[Judged]) -> None:
        """Against torch.compile, each task's eager/compile ratio is measured once, by the main
        process, and shared: every rank pays a task's results against the same baseline."""
        if self.reward.config.baseline is not BaselineKind.COMPILE:
            return
        needed = self.ranks.gather([j.rollout.task for j in judged if j.status is Status.CORRECT])
        wanted = sorted(set(needed) - set(self.compile_speedups))
        if not wanted:
            return
        measured = {name: self._measure_compile(self.tasks[name]) for name in wanted} if self.ranks.is_main else None
        shared = self.ranks.broadcast(measured)
        self.compile_speedups.update(shared or {})

    def _compile_speedup(self, task: Task, j: Judged) -> float | None:
        """eager/compile time ratio of the task, when the reward is measured against torch.compile."""
        if self.reward.config.baseline is not BaselineKind.COMPILE or j.status is not Status.CORRECT:
            return None
        return self.compile_speedups.get(task.name)

    def _measure_compile(self, task: Task) -> float | None:
        if self.db is not None and self.reuse is not None:
            rec = self.db.get_baseline(task.name, self.reuse.device, self.reuse.size)
            if rec is not None and rec.compile_ms:
                return float(rec.eager_ms / rec.compile_ms)
        measure = getattr(self.backend, "baseline", None)
        if measure is None:
            return None
        try:
            b = measure(task)
        except Exception as e:  # noqa: BLE001 - no compile baseline: the reward says so in its parts
            log.warning("%s: torch.compile baseline failed: %s", task.name, e)
            return None
        if self.db is not None and getattr(b, "eager_ms", None):
            self.db.put_baseline(task=task.name, device=b.device, size=b.size, eager_ms=b.eager_ms,
                                 compile_ms=b.compile_ms, compile_ci=getattr(b, "compile_speedup_ci", None))
        return b.compile_speedup  # type: ignore[no-any-return]
