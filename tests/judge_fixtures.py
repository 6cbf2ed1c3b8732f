"""Judges for tests of what drives a judge (search, trainer, commands): a function of one candidate as
a `BatchJudge`, and the command-line flags that give a command the tests' quick timing."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kernelrl.candidate import Candidate
from kernelrl.result import EvalResult
from kernelrl.tasks.task import Task

# The timing of conftest.py's `quick_config`, as flags of any command that judges (`eval`, `bench`,
# `collect`, ...): tests of what a command prints or stores need no 1 % interval, and the default's
# 400 rounds took ~7 s of a ~13 s `kernelrl eval` of the tiny task.
QUICK_TIMING = ("--timing.min-rounds", "5", "--timing.max-rounds", "40", "--timing.min-spot-checks", "2")


class OneAtATime:
    """A `kernelrl.judge.contract.BatchJudge` that judges each item with `evaluate(task, candidate)`."""

    def __init__(self, evaluate: Callable[[Task, Candidate], EvalResult]) -> None:
        self.evaluate = evaluate

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]]) -> list[EvalResult]:
        return [self.evaluate(task, Candidate(source=c) if isinstance(c, str) else c) for task, c in items]
