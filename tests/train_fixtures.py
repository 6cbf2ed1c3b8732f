"""Shared helpers for the learner's tests (not a test module): a scripted judge and answers.

`ScriptedBackend` stands in for the evaluator where a test is about the plumbing around it (the
real evaluator is used by the tests that show the recipe end to end): it records every
`evaluate_batch` call and judges a program by markers in its text.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from kernelrl.candidate import Candidate
from kernelrl.result import EvalResult, Finding, Severity, Status
from kernelrl.tasks.task import Task

CORRECT = "```python\nclass ModelNew:\n    pass  # fast\n```\n"


def answer(marker: str, *, prose: str = "Analysis first.") -> str:
    """An answer whose program carries `marker` (see `judge_by_marker`)."""
    return f"{prose}\n\n```python\nclass ModelNew:\n    pass  # {marker}\n```\n"


def judge_by_marker(task: Task, source: str) -> EvalResult:
    """`# fast2.0` -> correct at 2.0x, `# wrong` -> incorrect, `# hack` -> flagged, `# taskerror` ->
    task_error, `# warn` -> correct 1.0x with a warning, anything else -> compile_error."""
    if "# fast" in source:
        speed = float(source.split("# fast", 1)[1].split()[0] or 1.0)
        return EvalResult(task=task.name, status=Status.CORRECT, speedup=speed, message="correct")
    if "# warn" in source:
        return EvalResult(task=task.name, status=Status.CORRECT, speedup=1.0, message="correct",
                          findings=[Finding(rule="odd_thing", message="odd", severity=Severity.WARN)])
    if "# wrong" in source:
        return EvalResult(task=task.name, status=Status.INCORRECT, message="wrong values")
    if "# hack" in source:
        return EvalResult(task=task.name, status=Status.FLAGGED, message="flagged: cached_output",
                          findings=[Finding(rule="cached_output", message="returns a stored tensor")])
    if "# taskerror" in source:
        return EvalResult(task=task.name, status=Status.TASK_ERROR, message="the reference hangs")
    return EvalResult(task=task.name, status=Status.COMPILE_ERROR, message="does not build")


class ScriptedBackend:
    """An `evaluate_batch` backend that judges by `judge` and records its calls."""

    def __init__(self, judge: Callable[[Task, str], EvalResult] = judge_by_marker) -> None:
        self.judge = judge
        self.calls: list[list[tuple[str, str]]] = []
        self._lock = threading.Lock()

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]]) -> list[EvalResult]:
        pairs = [(t, c.source if isinstance(c, Candidate) else c) for t, c in items]
        with self._lock:
            self.calls.append([(t.name, s) for t, s in pairs])
        return [self.judge(t, s) for t, s in pairs]

    def close(self) -> None:
        pass
