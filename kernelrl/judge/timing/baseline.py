"""Baselines: how fast a task's own reference is, eager and under torch.compile.

Guarantees: both numbers come from one interleaved measurement in which the eager reference and
the same reference under `torch.compile` are members of the same timing group
(`kernelrl.judge.evaluator.Evaluator.baseline`), so their ratio is as fair as any candidate's
speedup, and it carries the same kind of 95 % interval (`compile_speedup_ci`): a compile/eager
ratio whose interval holds 1.0 says the two are within the measurement's noise. If compilation
fails (no compiler, unsupported op) `compile_ms` is None and `compile_error` says why. An
evaluator with `compile_baseline` measures the baseline in the same group as a task's
candidates, at no extra measurement.

Does not store anything on disk: `BaselineStore` keeps baselines for an evaluator's life; the
search loop stores them in the code database.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass
from typing import Any

from kernelrl.judge.timing.timer import CandidateTiming, GroupTiming
from kernelrl.plain import to_plain


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """How fast a task's own reference is, eager and under torch.compile, measured side by side."""

    task: str
    device: str
    size: str
    eager_ms: float
    compile_ms: float | None
    compile_error: str = ""
    # 95 % interval of eager / compiled, from the same rounds as `compile_ms` (None without it)
    compile_speedup_ci: tuple[float, float] | None = None

    @property
    def compile_speedup(self) -> float | None:
        """eager / compiled: above 1 means torch.compile beats eager."""
        return None if self.compile_ms is None else self.eager_ms / self.compile_ms

    @property
    def within_noise(self) -> bool:
        """torch.compile and eager cannot be told apart: the ratio's interval holds 1.0."""
        ci = self.compile_speedup_ci
        return ci is not None and ci[0] <= 1.0 <= ci[1]

    def to_dict(self) -> dict[str, Any]:
        out = to_plain(self)
        assert isinstance(out, dict)
        return {**out, "compile_speedup": self.compile_speedup, "compile_error": self.compile_error or None}


def baseline_from_timing(*, task: str, device: str, size: str, timing: GroupTiming,
                         compiled: CandidateTiming | None, compiled_error: str | None,
                         known: Baseline | None) -> Baseline | None:
    """The baseline a group's measurement gives (pure): the reference's median as eager, and the
    compiled reference's timing (a member of the same group) as compiled; what the group did not
    measure is kept from `known`. None when the reference was not timed."""
    if not timing.reference_ms:
        return None
    eager_ms = statistics.median(timing.reference_ms)
    compile_ms, error, ci = (known.compile_ms, known.compile_error, known.compile_speedup_ci) if known else (None, "", None)
    if compiled_error is not None:
        compile_ms, error, ci = None, compiled_error, None
    elif compiled is not None and compiled.speedup:
        compile_ms, error, ci = eager_ms / compiled.speedup, "", compiled.speedup_ci
    elif compiled is not None and compiled.failure is not None:
        compile_ms, error, ci = None, compiled.failure.message.strip().splitlines()[0][:300], None
    return Baseline(task=task, device=device, size=size, eager_ms=eager_ms, compile_ms=compile_ms,
                    compile_error=error, compile_speedup_ci=ci)


class BaselineStore:
    """Baselines by task key, for an evaluator's life. Thread-safe."""

    def __init__(self) -> None:
        self._by_key: dict[str, Baseline] = {}
        self._guard = threading.Lock()

    def get(self, key: str) -> Baseline | None:
        with self._guard:
            return self._by_key.get(key)

    def put(self, key: str, baseline: Baseline) -> None:
        with self._guard:
            self._by_key[key] = baseline
