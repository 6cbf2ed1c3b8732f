"""Baselines: how fast a task's own reference is, eager and under torch.compile.

Guarantees: both numbers come from one interleaved measurement in which the eager reference and
the same reference under `torch.compile` are members of the same timing group
(`kernelrl.judge.evaluator.Evaluator.baseline`), so their ratio is as fair as any candidate's
speedup. If compilation fails (no compiler, unsupported op) `compile_ms` is None and
`compile_error` says why. An evaluator with `compile_baseline` measures the baseline in the same
group as a task's candidates, at no extra measurement.

Does not store anything: the evaluator keeps baselines for its life; the search loop stores them
in the code database.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernelrl.judge.evaluator import EvalConfig
    from kernelrl.tasks.task import Task


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """How fast a task's own reference is, eager and under torch.compile, measured side by side."""

    task: str
    device: str
    size: str
    eager_ms: float
    compile_ms: float | None
    compile_error: str = ""

    @property
    def compile_speedup(self) -> float | None:
        """eager / compiled: above 1 means torch.compile beats eager."""
        return None if self.compile_ms is None else self.eager_ms / self.compile_ms

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "device": self.device, "size": self.size, "eager_ms": self.eager_ms,
                "compile_ms": self.compile_ms, "compile_speedup": self.compile_speedup,
                "compile_error": self.compile_error or None}


def measure_baseline(task: Task, config: EvalConfig | None = None, *, compile: bool = True) -> Baseline:
    """A one-off measurement (keep an `Evaluator` and call its `baseline` for many tasks)."""
    from kernelrl.judge.evaluator import Evaluator

    with Evaluator(config) as ev:
        return ev.baseline(task, compile=compile)
