"""The TRL reward function: a batch of completions in, one reward (or None) per completion out.

`KernelRewardFunction(backend, tasks=..., reward=..., db=...)` is passed to `GRPOTrainer` as a
reward function. For each call (one generation batch):

1. each completion (a string, or chat messages) becomes the answer's text; its code is the last
   complete fenced block (`kernelrl.candidate.extract_code`);
2. the whole batch is judged by one `backend.evaluate_batch` call (`kernelrl.train.rollouts`),
   so the evaluator runs the candidates in its own workers, each under its own limits: a step
   waits for its batch no longer than the evaluator's per-candidate limits allow;
3. each verdict is scored by `kernelrl.reward.RewardModel.score` with the task's level (the
   clip window falls back to it), the completion's token count (length term) and, when the
   reward is measured against torch.compile, the task's eager/compile ratio; an answer without
   code gets the no-code penalty; a `task_error` gets None (TRL ignores it);
4. with GRPO-RoC on, each group (a prompt's consecutive rollouts) keeps the share `roc.keep`
   chosen by `kernelrl.train.roc.select`; dropped rollouts get None;
5. the curriculum hears how each group went (flat or no correct sample: resample it sooner);
6. with a database, every generated code and its verdict is written back (raw and clipped
   reward, kept or not, in the candidate's `meta`), so later prompts show them;
7. raw and clipped rewards and the verdicts are logged: to TRL's metrics (`kernelrl/...`), to
   its completions table (`log_extra`), and one line per batch to the console.

Guarantees: returns exactly one value per completion, in order; never raises for a candidate's
or task's fault; one `evaluate_batch` call per invocation at most.

Does not generate, and does not decide verdicts (the backend does) or the mapping (the reward
model does).
"""

from __future__ import annotations

import logging
import random
import statistics
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernelrl.result import Status
from kernelrl.reward import BaselineKind, Reward, RewardModel
from kernelrl.tasks.task import Task
from kernelrl.train.curriculum import Curriculum
from kernelrl.train.model import completion_text, prompt_text
from kernelrl.train.roc import RoCConfig, groups, problems, select
from kernelrl.train.rollouts import (
    EvalSettings,
    Judged,
    Rollout,
    evaluate_rollouts,
    store_rollouts,
)

log = logging.getLogger("kernelrl.train.reward")


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


@dataclass(frozen=True, kw_only=True)
class BatchLog:
    """One reward call: what the evaluator said and what the trainer got."""

    step: int
    rollouts: tuple[RolloutLog, ...]
    evaluated: int  # candidates sent to the backend (reused and code-less ones are not)

    @property
    def statuses(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rollouts:
            key = r.status.value if r.status is not None else "no_code"
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

    def __init__(self, backend: Any, *, tasks: Mapping[str, Task], reward: RewardModel | None = None,
                 db: Any = None, roc: RoCConfig | None = None, curriculum: Curriculum | None = None,
                 proposer: str = "grpo", reuse: EvalSettings | None = None, run_id: int | None = None,
                 max_completion_tokens: int | None = None, compile_speedups: Mapping[str, float] | None = None,
                 console: Any = None, seed: int = 0, keep_logs: int = 100) -> None:
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
        self.rng = random.Random(seed)
        self.logs: deque[BatchLog] = deque(maxlen=keep_logs)  # the latest batches
        self.calls = 0
        # totals over this object's life
        self.rollouts = 0
        self.evaluated = 0
        self.clipped = 0
        self.statuses: dict[str, int] = {}
        self._lock = threading.Lock()

    # -- TRL's entry point ---------------------------------------------------------------------

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], task: Sequence[str],
                 completion_ids: Sequence[Sequence[int]] | None = None, trainer_state: Any = None,
                 log_metric: Any = None, log_extra: Any = None, parents: Sequence[Sequence[int]] | None = None,
                 **kwargs: Any) -> list[float | None]:
        if not (len(prompts) == len(completions) == len(task)):
            raise ValueError(f"{len(prompts)} prompts, {len(completions)} completions and {len(task)} task names")
        unknown = sorted({name for name in task if name not in self.tasks})
        if unknown:
            raise KeyError(f"task(s) not in this run: {', '.join(unknown)}")
        step = int(getattr(trainer_state, "global_step", 0) or 0)
        with self._lock:
            self.calls += 1
            rollouts = [Rollout(task=name, prompt=prompt_text(p), answer=completion_text(c),
                                completion_tokens=len(completion_ids[i]) if completion_ids is not None else None,
                                parents=tuple(parents[i]) if parents is not None else ())
                        for i, (name, p, c) in enumerate(zip(task, prompts, completions))]
            judged = evaluate_rollouts(self.backend, rollouts, self.tasks, db=self.db, reuse=self.reuse)
            rewards = [self._score(j) for j in judged]
            kept = self._select(judged, rewards)
            values = [r.value if r is not None and k else None for r, k in zip(rewards, kept)]
            self._tell_curriculum(judged, rewards, kept)
            if self.db is not None:
                judged = store_rollouts(self.db, judged, proposer=self.proposer, step=step, run_id=self.run_id,
                                        settings=self.reuse, meta=[_meta(step, r, k) for r, k in zip(rewards, kept)])
            evaluated = sum(1 for j in judged if j.code is not None and j.reused_from is None)
            logs = tuple(_rollout_log(j, r, k, v) for j, r, k, v in zip(judged, rewards, kept, values))
            batch = BatchLog(step=step, evaluated=evaluated, rollouts=logs)
            self.logs.append(batch)
            self.rollouts += len(batch.rollouts)
            self.evaluated += batch.evaluated
            self.clipped += batch.clipped
            for key, n in batch.statuses.items():
                self.statuses[key] = self.statuses.get(key, 0) + n
        self._report(batch, log_metric, log_extra)
        return values

    # -- pieces --------------------------------------------------------------------------------

    def _score(self, j: Judged) -> Reward | None:
        task = self.tasks[j.rollout.task]
        return self.reward.score(j.result, answer=j.rollout.answer, completion_tokens=j.rollout.completion_tokens,
                                 level=task.level, compile_speedup=self._compile_speedup(task, j))

    def _compile_speedup(self, task: Task, j: Judged) -> float | None:
        """eager/compile time ratio of the task, when the reward is measured against torch.compile."""
        if self.reward.config.baseline is not BaselineKind.COMPILE or j.status is not Status.CORRECT:
            return None
        if task.name not in self.compile_speedups:
            self.compile_speedups[task.name] = self._measure_compile(task)
        return self.compile_speedups[task.name]

    def _measure_compile(self, task: Task) -> float | None:
        if self.db is not None and self.reuse is not None:
            rec = self.db.get_baseline(task.name, self.reuse.device, self.reuse.size)
            if rec is not None and rec.compile_ms:
                return rec.eager_ms / rec.compile_ms
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
                                 compile_ms=b.compile_ms)
        return b.compile_speedup

    def _select(self, judged: Sequence[Judged], rewards: Sequence[Reward | None]) -> list[bool]:
        if not self.roc.enabled:
            return [r is not None for r in rewards]
        kept = [False] * len(judged)
        keys = [(j.rollout.task, j.rollout.prompt) for j in judged]
        for group in groups(keys):
            raws = [rewards[i].raw if rewards[i] is not None else None for i in group]  # type: ignore[union-attr]
            counts = [problems(judged[i].rollout.answer, judged[i].result, truncated=self._truncated(judged[i]))
                      for i in group]
            for i, keep in zip(group, select(raws, counts, self.roc, self.rng)):
                kept[i] = keep
        return kept

    def _truncated(self, j: Judged) -> bool:
        n = j.rollout.completion_tokens
        return self.max_completion_tokens is not None and n is not None and n >= self.max_completion_tokens

    def _tell_curriculum(self, judged: Sequence[Judged], rewards: Sequence[Reward | None],
                         kept: Sequence[bool]) -> None:
        if self.curriculum is None:
            return
        keys = [(j.rollout.task, j.rollout.prompt) for j in judged]
        for group in groups(keys):
            values = [rewards[i].value for i in group if rewards[i] is not None and kept[i]]  # type: ignore[union-attr]
            correct = any(judged[i].status is Status.CORRECT for i in group)
            self.curriculum.observe(judged[group[0]].rollout.task, values, any_correct=correct)

    def _report(self, batch: BatchLog, log_metric: Any, log_extra: Any) -> None:
        n = max(1, len(batch.rollouts))
        raws, values = batch.raws, batch.values
        metrics = {
            "kernelrl/raw_reward": statistics.fmean(raws) if raws else 0.0,
            "kernelrl/clipped_reward": statistics.fmean(values) if values else 0.0,
            "kernelrl/clipped_share": batch.clipped / n,
            "kernelrl/correct_share": batch.statuses.get(Status.CORRECT.value, 0) / n,
            "kernelrl/flagged_share": batch.statuses.get(Status.FLAGGED.value, 0) / n,
            "kernelrl/no_code_share": batch.statuses.get("no_code", 0) / n,
            "kernelrl/kept_share": sum(r.kept for r in batch.rollouts) / n,
        }
        if callable(log_metric):
            for name, value in metrics.items():
                log_metric(name, value)
        if callable(log_extra):
            log_extra("verdict", [r.status.value if r.status else "no_code" for r in batch.rollouts])
            log_extra("raw_reward", [r.raw for r in batch.rollouts])
            log_extra("clipped_reward", [r.value for r in batch.rollouts])
        log.info("step %d: %s; raw %s; trained on %s", batch.step, batch.statuses,
                 [round(x, 3) for x in raws], [None if r.value is None else round(r.value, 3) for r in batch.rollouts])
        if self.console is not None:
            from kernelrl.report.console import render_reward_batch

            render_reward_batch(batch, self.console)

    # -- checkpoints ---------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"reward": self.reward.state(), "curriculum": self.curriculum.state() if self.curriculum else None,
                "compile_speedups": self.compile_speedups}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.reward.load_state(state.get("reward") or {})
        if self.curriculum is not None and state.get("curriculum"):
            self.curriculum.load_state(state["curriculum"])
        self.compile_speedups.update(state.get("compile_speedups") or {})


def _meta(step: int, reward: Reward | None, kept: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"stage": "grpo", "step": step, "kept": kept}
    if reward is not None:
        out.update(raw=reward.raw, reward=reward.value, clipped=reward.clipped, band=reward.band,
                   within_noise=reward.within_noise)
    return out


def _rollout_log(j: Judged, r: Reward | None, kept: bool, value: float | None) -> RolloutLog:
    return RolloutLog(task=j.rollout.task, status=j.status, speedup=j.result.speedup if j.result else None,
                      raw=r.raw if r is not None else None, value=value, clipped=bool(r and r.clipped), kept=kept,
                      candidate_id=j.candidate_id, reused=j.reused_from is not None)
