"""Judges for tests of what drives a judge (search, trainer, commands): a function of one candidate as
a `BatchJudge`, and the command-line flags that give a command the tests' quick timing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kernelrl.candidate import Candidate
from kernelrl.result import EvalResult
from kernelrl.tasks.task import Task

if TYPE_CHECKING:
    from kernelrl.judge.timing.timer import TimingConfig

# Timing for tests whose verdicts are not about a speedup's precision (conftest.py's `quick_config`
# has it): the default's 400 rounds took ~7 s of a ~13 s `kernelrl eval` of the tiny task.
QUICK_TIMING_SETTINGS = {"min_rounds": 5, "max_rounds": 40, "max_timing_s": 2.0, "warmup_calls": 2, "min_spot_checks": 2}
# No A/A copy of the reference in those tests' groups (`EvalConfig.aa_tolerance` 0): a fourth
# worker and a third timed member cost ~2.4 s of a ~7.4 s single-candidate evaluation here, and
# their verdicts do not ask whether a speedup is noise. The A/A pair has its own tests
# (tests/judge/test_evaluator.py) and the red-team fixtures keep it; the escapes (checks/test_escapes.py) do not.
QUICK_AA_TOLERANCE = 0.0
# The same as flags of any command that judges (`eval`, `bench`, `collect`, ...).
QUICK_TIMING = tuple(part for k, v in QUICK_TIMING_SETTINGS.items() if k != "max_timing_s"
                     for part in (f"--timing.{k.replace('_', '-')}", str(v))) + ("--aa-tolerance", str(QUICK_AA_TOLERANCE))


def quick_timing() -> TimingConfig:
    """`QUICK_TIMING_SETTINGS` as the evaluator's timing config."""
    from kernelrl.judge.timing.timer import TimingConfig

    return TimingConfig(**QUICK_TIMING_SETTINGS)


class OneAtATime:
    """A `kernelrl.judge.contract.BatchJudge` that judges each item with `evaluate(task, candidate)`."""

    def __init__(self, evaluate: Callable[[Task, Candidate], EvalResult]) -> None:
        self.evaluate = evaluate

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]]) -> list[EvalResult]:
        return [self.evaluate(task, Candidate(source=c) if isinstance(c, str) else c) for task, c in items]
