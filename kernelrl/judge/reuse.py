"""Judged before? The one answer the evaluator's result cache, the search and the trainer share.

`JudgedKey` is what makes two judgings the same judging: the task (its name and the hash of its
source and size presets, `Task.identity_hash`), the program (the hash of its source) and the
evaluator config it is judged under (its fingerprint,
`kernelrl.judge.eval_config.config_fingerprint`: device, size, policy, constants, tolerances,
correctness sets, timing, sandbox, ...). `judged_before(store, key)` is the verdict a
store holds for that key, when it may be reused; a store is anything with `find_verdict(key)`:
the evaluator's in-memory `ResultCache`, or the run database
(`kernelrl.store.Database.find_verdict`, which also requires the task's current
source in its task table).

Guarantees:
- one key and one rule for every caller: a verdict is reused only for the same task name, task
  source and size presets, program source and fingerprint;
- a `judge_error` (the judge failed, not the program) and a `task_error` (the task's reference
  failed: the task may have been fixed or the machine less busy) are never reused, and a
  `ResultCache` does not keep them; an answer without code (`no_code`) is never judged, so never
  looked up.

Does not decide who judges a program not judged before, nor share one evaluation between two
callers asking at once (the search's `kernelrl.search.judging` does that within a run).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from kernelrl.result import EvalResult, Status
from kernelrl.tasks.task import Task

__all__ = ["JudgedKey", "Known", "ResultCache", "VerdictStore", "judged_before", "reusable"]

# Statuses that are not a verdict on the program: never reused, never kept.
NOT_REUSED = frozenset({Status.JUDGE_ERROR, Status.TASK_ERROR})


@dataclass(frozen=True)
class JudgedKey:
    """This exact program, for this task, under these judging settings."""

    task: str  # the task's name
    task_hash: str  # `Task.identity_hash`: a changed task file, or changed size presets, is another task
    source_hash: str  # `kernelrl.candidate.source_hash` of the program
    fingerprint: str  # `config_fingerprint` of the evaluator config; "" never matches a stored verdict

    @classmethod
    def of(cls, task: Task, source_hash: str, fingerprint: str) -> JudgedKey:
        return cls(task=task.name, task_hash=task.identity_hash, source_hash=source_hash, fingerprint=fingerprint)


@dataclass(frozen=True)
class Known:
    """A verdict reached before: the result and, from the run database, the candidate it was stored for."""

    result: EvalResult
    candidate_id: int | None = None


class VerdictStore(Protocol):
    def find_verdict(self, key: JudgedKey) -> Known | None: ...


def reusable(result: EvalResult) -> bool:
    """Whether a verdict may answer for the same key again (the module docstring says which may not)."""
    return result.status not in NOT_REUSED


def judged_before(store: VerdictStore | None, key: JudgedKey) -> Known | None:
    """The reusable verdict `store` holds for `key`; None when there is none (or no store, or no fingerprint)."""
    if store is None or not key.fingerprint:
        return None
    known = store.find_verdict(key)
    return known if known is not None and reusable(known.result) else None


class ResultCache:
    """The evaluator's verdicts of this process, the most recent `size` kept; thread-safe."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._results: OrderedDict[JudgedKey, EvalResult] = OrderedDict()
        self._guard = threading.Lock()

    def __len__(self) -> int:
        return len(self._results)

    def find_verdict(self, key: JudgedKey) -> Known | None:
        with self._guard:
            hit = self._results.get(key)
        return Known(result=hit) if hit is not None else None

    def remember(self, key: JudgedKey, result: EvalResult) -> None:
        """Keep `result` for `key` when it may be reused (a judge's or task's failure is tried again)."""
        if not reusable(result) or not key.fingerprint:
            return
        with self._guard:
            self._results[key] = result
            self._results.move_to_end(key)
            while len(self._results) > self.size:
                self._results.popitem(last=False)
