"""What callers need of a judge: the seams where anything that can evaluate plugs in.

The search, the trainer, the bench and the audit take a judge, not an `Evaluator`: an in-process
`kernelrl.judge.evaluator.Evaluator`, the reward server's lanes (`kernelrl.serve`), the HTTP
client (`kernelrl.serve.client.RewardClient`) or a test double all fit, checked by the type
checker rather than by convention.

- `BatchJudge`: `evaluate_batch(items) -> list[EvalResult]`, results in the order given, never
  raising for a candidate's or a task's fault;
- `ProfilingJudge`: also `profile(task)`, what a reference worker read about a task (shapes,
  FLOPs, bytes) for prompts, or None where the judge cannot say.

Does not judge anything: every verdict comes from an `Evaluator` somewhere behind the seam.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kernelrl.candidate import Candidate
from kernelrl.judge.profile import TaskProfile
from kernelrl.result import EvalResult
from kernelrl.tasks.task import Task

__all__ = ["BatchJudge", "ProfilingJudge"]


class BatchJudge(Protocol):
    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]]) -> list[EvalResult]: ...


class ProfilingJudge(BatchJudge, Protocol):
    def profile(self, task: Task) -> TaskProfile | None: ...
