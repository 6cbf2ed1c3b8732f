"""What callers need of a judge: the seams where anything that can evaluate plugs in.

The search, the trainer, the bench and the audit take a judge, not an `Evaluator`: an in-process
`kernelrl.judge.evaluator.Evaluator`, the reward server's lanes (`kernelrl.serve`), the HTTP
client (`kernelrl.backends.client.RewardClient`) or a test double all fit, checked by the type
checker rather than by convention.

- `BatchJudge`: `evaluate_batch(items) -> list[EvalResult]`, results in the order given, never
  raising for a candidate's or a task's fault;
- `ProfilingJudge`: also `profile(task)`, what a reference worker read about a task (shapes,
  FLOPs, bytes) for prompts, or None where the judge cannot say;
- `OwnedJudge`: a `ProfilingJudge` its holder closes (`close()`), as every judge built from a
  config is (`kernelrl.backends.judges.make_judge`);
- `SearchJudge`: everything a search uses when its judge has it (the in-process `Evaluator`
  has all of it): `evaluate_batch(items, on_result=...)` handing each result over as soon as its
  group ends, the `fingerprint` of its settings, the baselines it measured (`cached_baseline`)
  and the machine's peaks (`peaks`) that prompts state. A search takes any `BatchJudge` and uses
  these where `isinstance(judge, SearchJudge)`.

Does not judge anything: every verdict comes from an `Evaluator` somewhere behind the seam.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kernelrl.candidate import Candidate
from kernelrl.judge.harness.profile import TaskProfile
from kernelrl.result import EvalResult
from kernelrl.tasks.task import Task

if TYPE_CHECKING:
    from kernelrl.judge.timing.baseline import Baseline
    from kernelrl.judge.timing.roofline import MachinePeaks

__all__ = ["BatchJudge", "OwnedJudge", "ProfilingJudge", "SearchJudge"]


class BatchJudge(Protocol):
    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]]) -> list[EvalResult]: ...


class ProfilingJudge(BatchJudge, Protocol):
    def profile(self, task: Task) -> TaskProfile | None: ...


class OwnedJudge(ProfilingJudge, Protocol):
    def close(self) -> None: ...


@runtime_checkable
class SearchJudge(Protocol):
    fingerprint: str

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]], *,
                       on_result: Callable[[int, EvalResult], None] | None = None) -> list[EvalResult]: ...

    def profile(self, task: Task) -> TaskProfile | None: ...

    def cached_baseline(self, task: Task) -> Baseline | None: ...

    def peaks(self) -> MachinePeaks | None: ...
