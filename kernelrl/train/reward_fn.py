"""The TRL reward function: a batch of completions in, one reward (or None) per completion out.

`KernelRewardFunction(backend, tasks=..., reward=..., db=...)` is passed to `GRPOTrainer` as a
reward function. For each call (one generation batch of this process's rows):

1. each row's task must be the task its prompt was built for: the row's `key` column
   (`kernelrl.train.stream.row_key`) is checked against its task and prompt, and a mismatch is a
   `TaskMismatch`, never a reward;
2. each completion (a string, or chat messages) becomes the answer's text; its code is the last
   complete fenced block (`kernelrl.candidate.extract_code`); the batch is judged by one
   `backend.evaluate_batch` call (`kernelrl.train.rollouts`), so the evaluator runs the
   candidates in its own workers, each under its own limits;
3. each verdict gets its raw reward (`kernelrl.reward.RewardModel.raw`, with the task's level,
   the completion's token count and, against torch.compile, the task's eager/compile ratio); a
   correct program that is one of the versions its prompt showed (`kernelrl.train.copies`:
   the same after normalising layout, comments and names) is paid as no speedup and recorded
   as a copy: only improving on what was shown pays;
4. every rank's raw rewards are gathered in the global batch's order (`kernelrl.train.ranks`;
   one process: its own), and the global batch is cut into groups of `group_size` rows (TRL's
   `num_generations`): every group must hold one task and one prompt across all ranks, or the
   call is a `TaskMismatch` (in vLLM server mode TRL generates a group's completions from its
   first row's prompt: a group that mixed prompts would score completions against another
   task). Without `group_size`, groups are runs of equal keys;
5. on every rank, in that one order: CUDA-L1's clip (`RewardModel.clip_batch`, windows of raw
   values; every band is the window's before this call, so no reward depends on the order of
   the rollouts in the batch),
   GRPO-RoC's choice per group (`kernelrl.train.roc.select`, one shared seed), and the
   curriculum's observation of each group; so every rank ends the call with the same windows,
   the same RoC generator and the same observations (only the main process's curriculum draws
   tasks, in `kernelrl.train.stream`), and RoC selects whole groups even when a group spans
   ranks. Dropped rollouts and `task_error`s get None (TRL ignores them);
6. with a database, this rank's codes and verdicts are written back (raw and clipped reward,
   the band, within noise or not, kept or not, step, rank and group in the candidate's `meta`),
   so later prompts show them and a run page can read every rollout by step;
7. raw and clipped rewards and the verdicts are logged: to TRL's metrics (`kernelrl/...`, over
   the global batch), to its completions table (`log_extra`, this rank's rows), one line per
   call to the console, and with several ranks one line naming every group's task.

`score_rollouts` is steps 2-6 for rollouts built by any caller: the single-turn path is
`__call__`, which turns TRL's columns into `Rollout`s; the multi-turn path
(`kernelrl.train.multiturn`) builds each turn's rollouts itself and calls `score_rollouts` once
per turn, telling the curriculum itself (once per group, from the episodes' returns).

Guarantees: returns exactly one value per completion, in order; never raises for a candidate's
or task's fault (only for a caller's bug: an unknown task, a row whose task is not its
prompt's); one `evaluate_batch` call per invocation at most; `state()` / `load_state()` carry
the windows, the curriculum, the RoC generator and measured compile baselines.

Does not generate, and does not decide verdicts (the backend does) or the mapping (the reward
model does).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import statistics
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernelrl.result import EvalResult, Status
from kernelrl.reward import BaselineKind, Reward, RewardModel
from kernelrl.search.records import RunMeta, RunStage
from kernelrl.tasks.task import Task
from kernelrl.train.copies import is_copy, shown_keys
from kernelrl.train.curriculum import Curriculum
from kernelrl.train.model import completion_text, prompt_text
from kernelrl.train.ranks import Ranks, SingleProcess
from kernelrl.train.roc import RoCConfig, groups, problems, select
from kernelrl.train.rollouts import (
    EvalSettings,
    Judged,
    Rollout,
    evaluate_rollouts,
    store_rollouts,
)
from kernelrl.train.stream import row_key

if TYPE_CHECKING:
    from rich.console import Console
    from transformers import TrainerState

    from kernelrl.judge.contract import ProfilingJudge
    from kernelrl.search.database import Database
    from kernelrl.train.sampling import Prompt


# What TRL passes a reward function to log with: a scalar metric, and a column of the completions table.
LogMetric = Callable[[str, float], object]
LogExtra = Callable[[str, list[object]], object]

log = logging.getLogger("kernelrl.train.reward")


class TaskMismatch(RuntimeError):
    """A completion would be scored against a task other than the one its prompt came from."""


@dataclass(frozen=True, kw_only=True)
class Scored:
    """One rollout as every rank sees it after the gather."""

    rank: int
    task: str
    key: str
    level: int | None
    reward: Reward | None  # raw; None: task_error
    problems: int  # GRPO-RoC's uncleanliness count
    correct: bool


@dataclass(frozen=True, kw_only=True)
class RolloutLog:
    task: str
    status: Status | None  # None: no code in the answer
    speedup: float | None
    raw: float | None  # None: no reward (task_error)
    value: float | None  # what TRL got: clipped, or None (task_error, or dropped by RoC)
    clipped: bool
    kept: bool
    candidate_id: int | None
    reused: bool  # the verdict came from the code database
    group: int = 0  # index of its group in the global batch
    copy: bool = False  # a correct program its prompt showed: paid as no speedup


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


class KernelRewardFunction:
    """TRL reward function: completions in, list[float | None] out."""

    __name__ = "kernelrl_reward"  # TRL reads reward_funcs' names

    def __init__(self, backend: ProfilingJudge, *, tasks: Mapping[str, Task], reward: RewardModel | None = None,
                 db: Database | None = None, roc: RoCConfig | None = None, curriculum: Curriculum | None = None,
                 proposer: str = "grpo", reuse: EvalSettings | None = None, run_id: int | None = None,
                 max_completion_tokens: int | None = None, compile_speedups: Mapping[str, float] | None = None,
                 console: Console | None = None, seed: int = 0, keep_logs: int = 100, ranks: Ranks | None = None,
                 group_size: int | None = None) -> None:
        if group_size is not None and group_size < 1:
            raise ValueError("group_size must be >= 1")
        self.backend = backend
        self.tasks = dict(tasks)
        self.reward = reward or RewardModel()
        self.db = db
        self.roc = roc or RoCConfig()
        self.curriculum = curriculum
        self.proposer = proposer
        self.reuse = reuse
        self.run_id = run_id
        self.max_completion_tokens = max_completion_tokens
        self.compile_speedups: dict[str, float | None] = dict(compile_speedups or {})
        self.console = console
        self.ranks: Ranks = ranks or SingleProcess()
        self.group_size = group_size
        self.rng = random.Random(seed)  # RoC's draws: the same seed and the same calls on every rank
        self.logs: deque[BatchLog] = deque(maxlen=keep_logs)  # the latest batches
        self.calls = 0
        # totals over this object's life, this rank's rollouts
        self.rollouts = 0
        self.evaluated = 0
        self.clipped = 0
        self.statuses: dict[str, int] = {}
        self._lock = threading.Lock()

    # -- TRL's entry point (the single-turn path) ----------------------------------------------

    def __call__(self, prompts: Sequence[Prompt], completions: Sequence[object], task: Sequence[str],
                 completion_ids: Sequence[Sequence[int]] | None = None, trainer_state: TrainerState | None = None,
                 log_metric: LogMetric | None = None, log_extra: LogExtra | None = None,
                 parents: Sequence[Sequence[int]] | None = None, key: Sequence[str] | None = None,
                 **kwargs: object) -> list[float | None]:
        if not (len(prompts) == len(completions) == len(task)):
            raise ValueError(f"{len(prompts)} prompts, {len(completions)} completions and {len(task)} task names")
        unknown = sorted({name for name in task if name not in self.tasks})
        if unknown:
            raise KeyError(f"task(s) not in this run: {', '.join(unknown)}")
        keys = [row_key(name, p) for name, p in zip(task, prompts)]
        if key is not None:
            for i, (mine, carried) in enumerate(zip(keys, key)):
                if mine != carried:
                    raise TaskMismatch(f"row {i}: task {task[i]!r} is not the task its prompt was built for "
                                       f"(key {carried}, expected {mine}); its completion would be scored against "
                                       "another task")
        rollouts = [Rollout(task=name, prompt=prompt_text(p), answer=completion_text(c),
                            completion_tokens=len(completion_ids[i]) if completion_ids is not None else None,
                            parents=tuple(parents[i]) if parents is not None else ())
                    for i, (name, p, c) in enumerate(zip(task, prompts, completions))]
        step = int(getattr(trainer_state, "global_step", 0) or 0)
        values, batch = self.score_rollouts(rollouts, keys=keys, step=step)
        self._report(batch, log_metric, log_extra)
        return values

    # -- the scoring path (any caller) ---------------------------------------------------------

    def score_rollouts(self, rollouts: Sequence[Rollout], *, keys: Sequence[str], step: int = 0,
                       meta: Sequence[RunMeta] | None = None, observe: bool = True
                       ) -> tuple[list[float | None], BatchLog]:
        """Judge, score, share across ranks, store (steps 2-6 of the module docstring); `meta` adds
        to each stored candidate's meta (a multi-turn episode's turn, say); `observe` False leaves
        the curriculum to the caller (a multi-turn episode tells it once per group, its returns)."""
        with self._lock:
            self.calls += 1
            judged = evaluate_rollouts(self.backend, rollouts, self.tasks, db=self.db, reuse=self.reuse)
            self._share_compile_baselines(judged)
            copies = self._copies(judged)
            mine = [Scored(rank=self.ranks.index, task=j.rollout.task, key=k, level=self.tasks[j.rollout.task].level,
                           reward=self._raw(j, copy=c),
                           problems=problems(j.rollout.answer, j.result, truncated=self._truncated(j)),
                           correct=j.status is Status.CORRECT)
                    for j, k, c in zip(judged, keys, copies)]
            every = self.ranks.gather(mine)
            start = sum(1 for s in every if s.rank < self.ranks.index)
            parts = self._groups(every, step)
            # One batch, one band per task: the bands are the windows' before this batch, so a
            # group's rewards do not depend on the order of its rollouts (RewardModel.clip_batch).
            rewards = self.reward.clip_batch([(s.reward, s.task, s.level) for s in every])
            kept = self._select(every, rewards, parts)
            if observe:
                self._tell_curriculum(every, rewards, kept, parts)
            group_of = {i: g for g, members in enumerate(parts) for i in members}
            here = range(start, start + len(judged))
            values = [rewards[i].value if rewards[i] is not None and kept[i] else None  # type: ignore[union-attr]
                      for i in here]
            if self.db is not None:
                judged = store_rollouts(self.db, judged, proposer=self.proposer, step=step, run_id=self.run_id,
                                        settings=self.reuse,
                                        meta=[_meta(step, rewards[i], kept[i], rank=self.ranks.index,
                                                    group=group_of[i]).merged(meta[n] if meta else RunMeta())
                                              for n, i in enumerate(here)])
            evaluated = sum(1 for j in judged if j.code is not None and j.reused_from is None)
            logs = tuple(_rollout_log(j, rewards[i], kept[i], v, group_of[i])
                         for j, i, v in zip(judged, here, values))
            batch = BatchLog(step=step, evaluated=evaluated, rollouts=logs, rank=self.ranks.index,
                             results=tuple(j.result for j in judged),
                             ranks=self.ranks.count, metrics=_metrics(every, rewards, kept),
                             groups=tuple(f"{every[m[0]].task}#{every[m[0]].key[:8]}" for m in parts))
            self.logs.append(batch)
            self.rollouts += len(batch.rollouts)
            self.evaluated += batch.evaluated
            self.clipped += batch.clipped
            for name, n in batch.statuses.items():
                self.statuses[name] = self.statuses.get(name, 0) + n
        return values, batch

    # -- pieces --------------------------------------------------------------------------------

    @staticmethod
    def _copies(judged: Sequence[Judged]) -> list[bool]:
        """Which programs are versions their own prompt showed (`kernelrl.train.copies`)."""
        shown: dict[str, frozenset[str]] = {}  # a group's rows share their prompt: parse it once
        out = []
        for j in judged:
            if j.code is None:
                out.append(False)
                continue
            text = j.rollout.shown if j.rollout.shown is not None else j.rollout.prompt
            if text not in shown:
                shown[text] = shown_keys(text)
            out.append(is_copy(j.code, shown[text]))
        return out

    def _raw(self, j: Judged, *, copy: bool = False) -> Reward | None:
        task = self.tasks[j.rollout.task]
        return self.reward.raw(j.result, answer=j.rollout.answer, completion_tokens=j.rollout.completion_tokens,
                               compile_speedup=self._compile_speedup(task, j), copy=copy)

    def _groups(self, every: Sequence[Scored], step: int) -> list[list[int]]:
        return self.cut_groups([(s.rank, s.task, s.key) for s in every], step)

    def cut_groups(self, rows: Sequence[tuple[int, str, str]], step: int) -> list[list[int]]:
        """A global batch's groups from its rows' (rank, task, key), in order: groups of `group_size`
        (runs of equal keys without one); each must hold one task and one prompt, whatever rank
        holds it, or the call is a `TaskMismatch`."""
        if self.group_size is None:
            return groups([(task, key) for _, task, key in rows])
        size = self.group_size
        if len(rows) % size:
            raise TaskMismatch(f"step {step}: {len(rows)} rows in the global batch is not a whole number of groups "
                               f"of {size}")
        out = [list(range(i, i + size)) for i in range(0, len(rows), size)]
        for g, members in enumerate(out):
            seen = {rows[i][1:] for i in members}
            if len(seen) > 1:
                held = ", ".join(f"{rows[i][1]}#{rows[i][2][:8]} (rank {rows[i][0]})" for i in members)
                raise TaskMismatch(f"step {step}: group {g} mixes prompts: {held}; completions would be scored "
                                   "against another task (are the ranks' prompt streams shared?)")
        return out

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

    def _select(self, every: Sequence[Scored], rewards: Sequence[Reward | None],
                parts: Sequence[Sequence[int]]) -> list[bool]:
        if not self.roc.enabled:
            return [r is not None for r in rewards]
        kept = [False] * len(every)
        for group in parts:
            raws = [rewards[i].raw if rewards[i] is not None else None for i in group]  # type: ignore[union-attr]
            for i, keep in zip(group, select(raws, [every[i].problems for i in group], self.roc, self.rng)):
                kept[i] = keep
        return kept

    def _truncated(self, j: Judged) -> bool:
        n = j.rollout.completion_tokens
        return self.max_completion_tokens is not None and n is not None and n >= self.max_completion_tokens

    def _tell_curriculum(self, every: Sequence[Scored], rewards: Sequence[Reward | None], kept: Sequence[bool],
                         parts: Sequence[Sequence[int]]) -> None:
        if self.curriculum is None:
            return
        for group in parts:
            values = [rewards[i].value for i in group if rewards[i] is not None and kept[i]]  # type: ignore[union-attr]
            self.curriculum.observe(every[group[0]].task, values, any_correct=any(every[i].correct for i in group))

    def _report(self, batch: BatchLog, log_metric: LogMetric | None, log_extra: LogExtra | None) -> None:
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
        if self.console is not None:
            print_batch(batch, self.console)
            if batch.ranks > 1:
                self.console.print(f"groups step {batch.step} rank {batch.rank}/{batch.ranks}: "
                                   + " ".join(f"{g}={name}" for g, name in enumerate(batch.groups)),
                                   highlight=False, soft_wrap=True)

    # -- checkpoints ---------------------------------------------------------------------------

    def state(self) -> dict[str, object]:
        version, internal, gauss = self.rng.getstate()
        return {"reward": self.reward.state(), "curriculum": self.curriculum.state() if self.curriculum else None,
                "compile_speedups": self.compile_speedups, "roc_rng": [version, list(internal), gauss]}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.reward.load_state(state.get("reward") or {})
        if self.curriculum is not None and state.get("curriculum"):
            self.curriculum.load_state(state["curriculum"])
        self.compile_speedups.update(state.get("compile_speedups") or {})
        if state.get("roc_rng"):
            version, internal, gauss = state["roc_rng"]
            self.rng.setstate((version, tuple(internal), gauss))


def _metrics(every: Sequence[Scored], rewards: Sequence[Reward | None], kept: Sequence[bool]) -> dict[str, float]:
    n = max(1, len(every))
    scored = [r for r in rewards if r is not None]
    values = [r.value for r, k in zip(rewards, kept) if r is not None and k]
    return {
        "kernelrl/raw_reward": statistics.fmean(r.raw for r in scored) if scored else 0.0,
        "kernelrl/clipped_reward": statistics.fmean(values) if values else 0.0,
        "kernelrl/clipped_share": sum(r.clipped for r in scored) / n,
        "kernelrl/correct_share": sum(s.correct for s in every) / n,
        "kernelrl/flagged_share": sum(r.status is Status.FLAGGED for r in scored) / n,
        "kernelrl/no_code_share": sum(r.status is None for r in scored) / n,
        "kernelrl/kept_share": sum(kept) / n,
        "kernelrl/within_noise_share": sum(r.within_noise for r in scored) / n,
        "kernelrl/copy_share": sum(r.copy for r in scored) / n,
    }


def _meta(step: int, reward: Reward | None, kept: bool, *, rank: int, group: int) -> RunMeta:
    meta = RunMeta(stage=RunStage.GRPO, step=step, kept=kept, rank=rank, group=group)
    if reward is None:
        return meta
    return dataclasses.replace(meta, raw=reward.raw, reward=reward.value, clipped=reward.clipped, band=reward.band,
                               within_noise=reward.within_noise, copy=reward.copy)


def _rollout_log(j: Judged, r: Reward | None, kept: bool, value: float | None, group: int) -> RolloutLog:
    return RolloutLog(task=j.rollout.task, status=j.status, speedup=j.result.speedup if j.result else None,
                      raw=r.raw if r is not None else None, value=value, clipped=bool(r and r.clipped), kept=kept,
                      candidate_id=j.candidate_id, reused=j.reused_from is not None, group=group,
                      copy=bool(r and r.copy))


def print_batch(batch: BatchLog, console: Console) -> None:
    """One line per reward call: the verdicts, then raw -> clipped rewards (x: dropped by RoC)."""
    statuses = ", ".join(f"{n} {s}" for s, n in sorted(batch.statuses.items()))
    parts = []
    for r in batch.rollouts:
        if r.raw is None:
            parts.append("none")
            continue
        text = f"{r.raw:+.3f}"
        if r.clipped and r.value is not None:
            text += f"->{r.value:+.3f}"
        if not r.kept:
            text += "x"
        parts.append(text)
    console.print(f"[bold]reward[/bold] step {batch.step}: {len(batch.rollouts)} rollouts ({statuses}); "
                  f"{batch.evaluated} judged; {batch.clipped} clipped; raw->clipped: {' '.join(parts)}",
                  highlight=False, soft_wrap=True)  # one line per batch, whole, so logs can be searched
