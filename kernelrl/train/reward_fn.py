"""The TRL reward function: a batch of completions in, one reward (or None) per completion out.

`KernelRewardFunction(run, shaping=RewardShaping(...), curriculum=..., reuse=..., ranks=...)` is
passed to `GRPOTrainer` as a reward function. `run` is the run's parts (`kernelrl.run_parts.RunParts`:
the judge, the tasks, the database, the run's row and its reporter); `shaping` what a verdict pays
and how a batch is shaped (the reward model, the copy rule, RoC, the group size, RoC's seed);
`reuse` which stored verdicts stand for the judge's (None: none). It is three parts, the way TRL
calls a reward function once per generation batch and trains on what it returns:

1. **the scorer** (`kernelrl.train.scorer.Scorer`: judge, reuse, copy, raw reward). Each row's
   task must be the task its prompt was built for (the row's `key`, `kernelrl.train.stream.row_key`;
   a mismatch is a `TaskMismatch`, never a reward); each completion's code is judged by one
   `backend.evaluate_batch` call (or reuses a stored verdict); a correct program that is a version
   the row's prompt showed (`shown`: database ids, compared in full) up to edits that change
   nothing, and not faster than it beyond noise, is a copy, paid at most as no speedup;
2. **the batch shaper** (`kernelrl.train.shaper.shape_batch`, a pure function): every rank's rows
   gathered in the global batch's order (`kernelrl.train.ranks`), cut into groups of `group_size`
   rows (TRL's `num_generations`; each one task and one prompt across all ranks, or a
   `TaskMismatch`), CUDA-L1's clip (damped from above, never lifted; bands from the windows before
   the batch), GRPO-RoC's choice per group (one shared generator state), and why each row trains on
   nothing; every rank computes the same result and keeps the same windows and generator;
3. **the effects** (`kernelrl.train.effects.RolloutEffects`): this rank's codes and verdicts
   written to the database (under the proposer label `grpo`) with what training did with them, the
   curriculum told once per group, TRL's metrics (`kernelrl/...`, `kernelrl/excluded/<why>`), its
   completions table and one console line per call; `totals` add up every call.

A row trains on nothing (TRL is handed None) when its verdict has no reward (`task_error`,
`judge_error`, an untimed run) or RoC dropped it; the trainer (`kernelrl.train.trainer`) then takes
it out of the batch before the loss, so it neither goes through backward nor counts in the loss's
normaliser.

`score_rollouts` is steps 1-3 for rollouts built by any caller: the single-turn path is
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

import random
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernelrl.reward import RewardModel
from kernelrl.store.records import RunMeta
from kernelrl.train.copies import CopyRule
from kernelrl.train.curriculum import Curriculum
from kernelrl.train.effects import BatchLog, LogExtra, LogMetric, RolloutEffects, print_batch, rollout_log
from kernelrl.train.model import completion_text, prompt_text
from kernelrl.train.ranks import Ranks, SingleProcess
from kernelrl.train.roc import RoCConfig
from kernelrl.train.rollouts import EvalSettings, Rollout
from kernelrl.train.scorer import Scorer
from kernelrl.train.shaper import TaskMismatch, batch_metrics, cut_groups, shape_batch
from kernelrl.train.stream import row_key

if TYPE_CHECKING:
    from transformers import TrainerState

    from kernelrl.run_parts import RunParts
    from kernelrl.store import Database
    from kernelrl.train.sampling import Prompt

__all__ = ["BatchLog", "KernelRewardFunction", "LogExtra", "LogMetric", "RewardShaping", "TaskMismatch", "Totals",
           "print_batch"]

# The latest batches a reward function keeps (`KernelRewardFunction.logs`).
KEPT_LOGS = 100


@dataclass(frozen=True, kw_only=True)
class RewardShaping:
    """What a verdict pays and how a batch's rewards are shaped (steps 1 and 2 of the module
    docstring), beside the run's parts: the reward model (the mapping, and the clip windows it
    keeps: the one part with state), the copy rule, the completion length at which an answer
    counts as cut off (TRL's `max_completion_length`; None: never), GRPO-RoC, the group size
    (TRL's `num_generations`; None: one group per call) and the seed of RoC's draws."""

    reward: RewardModel = field(default_factory=RewardModel)
    copy_rule: CopyRule = field(default_factory=CopyRule)
    max_completion_tokens: int | None = None
    roc: RoCConfig = field(default_factory=RoCConfig)
    group_size: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.group_size is not None and self.group_size < 1:
            raise ValueError("group_size must be >= 1")


@dataclass(kw_only=True)
class Totals:
    """What a reward function did over its life: its calls, and this rank's rollouts, how many were
    judged here (not reused), clipped, and of each verdict status."""

    calls: int = 0
    rollouts: int = 0
    evaluated: int = 0
    clipped: int = 0
    statuses: dict[str, int] = field(default_factory=dict)

    def add(self, batch: BatchLog) -> None:
        self.rollouts += len(batch.rollouts)
        self.evaluated += batch.evaluated
        self.clipped += batch.clipped
        for name, n in batch.statuses.items():
            self.statuses[name] = self.statuses.get(name, 0) + n


class KernelRewardFunction:
    """TRL reward function: completions in, list[float | None] out."""

    __name__ = "kernelrl_reward"  # TRL reads reward_funcs' names

    def __init__(self, run: RunParts, *, shaping: RewardShaping | None = None, curriculum: Curriculum | None = None,
                 reuse: EvalSettings | None = None, ranks: Ranks | None = None) -> None:
        shaping = shaping or RewardShaping()
        self.reward = shaping.reward
        self.ranks: Ranks = ranks or SingleProcess()
        self.tasks = {t.name: t for t in run.tasks}
        self.scorer = Scorer(run.judge, tasks=self.tasks, reward=self.reward, db=run.db, reuse=reuse,
                             copy_rule=shaping.copy_rule, max_completion_tokens=shaping.max_completion_tokens,
                             ranks=self.ranks)
        self.effects = RolloutEffects(db=run.db, curriculum=curriculum, proposer="grpo", reuse=reuse, run_id=run.run_id,
                                      reporter=run.reporter)
        self.roc = shaping.roc
        self.group_size = shaping.group_size
        self.rng = random.Random(shaping.seed)  # RoC's draws: the same seed and the same calls on every rank
        self.logs: deque[BatchLog] = deque(maxlen=KEPT_LOGS)  # the latest batches
        self.totals = Totals()  # over this object's life, this rank's rollouts
        self._lock = threading.Lock()

    @property
    def curriculum(self) -> Curriculum | None:
        return self.effects.curriculum

    @property
    def compile_speedups(self) -> dict[str, float | None]:
        return self.scorer.compile_speedups

    @property
    def db(self) -> Database | None:
        return self.scorer.db

    # -- TRL's entry point (the single-turn path) ----------------------------------------------

    def __call__(self, prompts: Sequence[Prompt], completions: Sequence[object], task: Sequence[str],
                 completion_ids: Sequence[Sequence[int]] | None = None, trainer_state: TrainerState | None = None,
                 log_metric: LogMetric | None = None, log_extra: LogExtra | None = None,
                 parents: Sequence[Sequence[int]] | None = None, key: Sequence[str] | None = None,
                 shown: Sequence[Sequence[int] | None] | None = None, **kwargs: object) -> list[float | None]:
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
                            parents=tuple(parents[i]) if parents is not None else (),
                            shown=tuple(ids) if shown is not None and (ids := shown[i]) is not None else None)
                    for i, (name, p, c) in enumerate(zip(task, prompts, completions))]
        step = int(getattr(trainer_state, "global_step", 0) or 0)
        values, batch = self.score_rollouts(rollouts, keys=keys, step=step)
        self.effects.report(batch, log_metric, log_extra)
        return values

    # -- the scoring path (any caller) ---------------------------------------------------------

    def score_rollouts(self, rollouts: Sequence[Rollout], *, keys: Sequence[str], step: int = 0,
                       meta: Sequence[RunMeta] | None = None, observe: bool = True
                       ) -> tuple[list[float | None], BatchLog]:
        """Score, shape, apply (steps 1-3 of the module docstring); `meta` adds to each stored
        candidate's meta (a multi-turn episode's turn, say); `observe` False leaves the curriculum
        to the caller (a multi-turn episode tells it once per group, its returns)."""
        with self._lock:
            self.totals.calls += 1
            judged = self.scorer.judge(rollouts)
            mine = self.scorer.score(judged, keys)
            every = self.ranks.gather(mine)
            start = sum(1 for s in every if s.rank < self.ranks.index)
            shaped = shape_batch(every, step=step, group_size=self.group_size, windows=self.reward.windows,
                                 smoothing=self.reward.config.smoothing, roc=self.roc, rng_state=self.rng.getstate())
            self.reward.set_windows(shaped.windows)
            self.rng.setstate(shaped.rng_state)
            if observe:
                self.effects.observe(every, shaped)
            here = range(start, start + len(judged))
            judged = self.effects.store(judged, shaped, here, step=step, rank=self.ranks.index, meta=meta)
            group_of = shaped.group_of()
            values = [shaped.values[i] for i in here]
            evaluated = sum(1 for j in judged if j.judged_here)
            logs = tuple(rollout_log(j, shaped, i, group_of[i]) for j, i in zip(judged, here))
            batch = BatchLog(step=step, evaluated=evaluated, rollouts=logs, rank=self.ranks.index,
                             results=tuple(j.result for j in judged), ranks=self.ranks.count,
                             metrics=batch_metrics(every, shaped),
                             groups=tuple(f"{every[m[0]].task}#{every[m[0]].key[:8]}" for m in shaped.groups))
            self.logs.append(batch)
            self.totals.add(batch)
        return values, batch

    def cut_groups(self, rows: Sequence[tuple[int, str, str]], step: int) -> list[list[int]]:
        """`kernelrl.train.shaper.cut_groups` at this function's group size."""
        return cut_groups(rows, step, self.group_size)

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
