"""Baselines: how fast the task's own reference is, eager and under torch.compile.

Guarantees: both numbers come from one evaluation that times the eager reference against the
same reference under `torch.compile`, interleaved in one run (`kernelrl.judge.evaluator`), so their
ratio is as fair as any candidate's speedup. If compilation fails (no compiler, unsupported op)
`compile_ms` is None and `compile_error` says why; the eager time is then measured alone.

Does not cache: callers (the search loop's database) store baselines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernelrl.judge.evaluator import EvalConfig, compare_reference_compiled, evaluate
from kernelrl.result import Status
from kernelrl.tasks.task import Task


@dataclass(frozen=True, kw_only=True)
class Baseline:
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


def _identity_candidate(task: Task) -> str:
    """The reference itself, renamed: times the eager reference when compile is not wanted."""
    return task.source + "\n\nModelNew = Model\n"


def measure_baseline(task: Task, config: EvalConfig | None = None, *, compile: bool = True) -> Baseline:
    config = config or EvalConfig()
    # The reference is trusted and is judged against itself: static checks would only see the
    # task's own code.
    cfg = EvalConfig(**{**config.__dict__, "static_checks": False})
    if compile:
        res = compare_reference_compiled(task, cfg)
        if res.status is Status.CORRECT and res.ref_time and res.cand_time:
            return Baseline(task=task.name, device=cfg.device, size=cfg.size, eager_ms=res.ref_time.median_ms,
                            compile_ms=res.cand_time.median_ms)
        error = res.message
    else:
        error = ""
    res = evaluate(task, _identity_candidate(task), cfg)
    if res.ref_time is None:
        raise RuntimeError(f"could not time the reference of {task.name}: {res.message}")
    return Baseline(task=task.name, device=cfg.device, size=cfg.size, eager_ms=res.ref_time.median_ms,
                    compile_ms=None, compile_error=error)
