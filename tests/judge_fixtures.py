"""Judges for tests of what drives a judge (search, trainer): a function of one candidate as a `BatchJudge`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kernelrl.candidate import Candidate
from kernelrl.result import EvalResult
from kernelrl.tasks.task import Task


class OneAtATime:
    """A `kernelrl.judge.contract.BatchJudge` that judges each item with `evaluate(task, candidate)`."""

    def __init__(self, evaluate: Callable[[Task, Candidate], EvalResult]) -> None:
        self.evaluate = evaluate

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]]) -> list[EvalResult]:
        return [self.evaluate(task, Candidate(source=c) if isinstance(c, str) else c) for task, c in items]
