"""A/A calibration: a task's reference timed against identical copies of itself.

Each run times the reference and two identical copies (the reference's own code, under another
name) in one timing group: the copies' speedups against the reference, and the second copy's
against the first (the same code in the other role), must all be 1.00 within the measurement's
noise. `kernelrl calibrate TASK` prints them; a skeptical user runs it before trusting a reward.

Guarantees: the copies are the judge's own programs (no static checks apply); every run is a
fresh timing group with fresh secret inputs, exactly as candidates are measured.

Does not correct anything: a bias it shows is a defect to find, never a factor to divide by.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernelrl.candidate import Candidate
from kernelrl.judge.context import JudgeContext
from kernelrl.judge.group import run_group
from kernelrl.judge.reference import ReferenceFailed
from kernelrl.plain import to_plain
from kernelrl.result import EvalResult, GroupPhases, Status, TimingRecord, TimingStop
from kernelrl.tasks.task import Task


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """One A/A run: identical code in three roles, timed together."""

    task: str
    speedup_a: float
    speedup_b: float
    ci_a: tuple[float, float] | None
    ci_b: tuple[float, float] | None
    b_over_a: float
    rounds: int
    calls_per_sample: int
    stopped_by: TimingStop
    reference_ms: float
    exchange_ms: float = 0.0  # the judge's exchange per sample, taken off every timed sample
    phases: GroupPhases | None = None  # where the run's wall time went

    def speedups(self) -> tuple[float, float, float]:
        """What identical code measured in this run: each copy against the reference, and B against A."""
        return self.speedup_a, self.speedup_b, self.b_over_a

    def within(self, tolerance: float) -> bool:
        return all(abs(s - 1.0) <= tolerance for s in (self.speedup_a, self.speedup_b, self.b_over_a))

    def to_dict(self) -> dict[str, Any]:
        out = to_plain(self)
        assert isinstance(out, dict)
        return out


def calibrate(ctx: JudgeContext, task: Task, *, runs: int = 5,
              on_run: Callable[[Calibration], None] | None = None) -> list[Calibration]:
    """A/A check: the reference against two identical copies of itself, `runs` times.

    Each run times the reference and both copies in one group: the copies' speedups against
    the reference, and the second copy's against the first (the same code in the other
    role), should all be 1.00 within the measurement's noise. `on_run` hears each run as it
    ends (a run at full size on a device can take tens of seconds).
    """
    if runs < 1:
        raise ValueError("runs must be >= 1")
    copies = [Candidate(source=task.source + f"\n\n# identical copy {c}\nModelNew = Model\n") for c in "ab"]
    out = []
    for _ in range(runs):
        got: dict[int, EvalResult] = {}

        def keep(positions: list[int], res: EvalResult, got: dict[int, EvalResult] = got) -> None:
            got[positions[0]] = res

        members = {c.hash: (c, [i]) for i, c in enumerate(copies)}
        run_group(ctx, task, members, keep, trusted=frozenset(members))
        a, b = got.get(0), got.get(1)
        if a is None or b is None or a.speedup is None or b.speedup is None:
            bad = next((r for r in (a, b) if r is not None and r.status is not Status.CORRECT), None)
            raise ReferenceFailed(f"{task.name}: calibration failed: {bad.message if bad else 'no result'}")
        timing = a.environment.timing or TimingRecord()
        made = Calibration(task=task.name, speedup_a=a.speedup, speedup_b=b.speedup,
                           ci_a=a.speedup_ci, ci_b=b.speedup_ci, b_over_a=b.speedup / a.speedup,
                           rounds=timing.rounds, calls_per_sample=timing.calls_per_sample,
                           stopped_by=timing.stopped_by,
                           reference_ms=a.ref_time.median_ms if a.ref_time else float("nan"),
                           exchange_ms=timing.exchange_ms, phases=a.environment.phases)
        out.append(made)
        if on_run is not None:
            on_run(made)
    return out


def noise_band(runs: list[Calibration]) -> tuple[float, float]:
    """The band of speedups identical code measured over A/A runs: a speedup inside it is noise."""
    values = [s for r in runs for s in r.speedups()]
    if not values:
        raise ValueError("no calibration runs")
    return min(values), max(values)
