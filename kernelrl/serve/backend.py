"""The backend contract: what the reward server and the trainers hand batches to.

A backend is anything with `evaluate_batch(items, *, size=None, policy=None) -> list[EvalResult]`
(results in the order given, never raising for a candidate's or a task's fault), a `capacity`
(how many batches it usefully runs at once: its number of lanes) and `close()`. The in-process
lanes (`kernelrl.serve.lanes.LocalLanes`), the Ray lanes (`kernelrl.serve.ray_backend.RayLanes`)
and the HTTP client (`kernelrl.backends.client.RewardClient`) all fit it; so does any test double.
Called without `size` and `policy`, `evaluate_batch` has `Evaluator.evaluate_batch`'s signature,
so anything that takes an evaluator takes a backend.

Does not judge anything itself: every verdict comes from a `kernelrl.judge.evaluator.Evaluator`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

from kernelrl.candidate import Candidate
from kernelrl.checks.policy import PolicyName
from kernelrl.judge.eval_config import EvalConfig
from kernelrl.judge.harness.profile import TaskProfile
from kernelrl.result import EvalResult
from kernelrl.tasks.task import Size, Task


class BackendKind(enum.StrEnum):
    LOCAL = "local"  # evaluators in the server's process, one per lane
    RAY = "ray"  # one Ray actor per lane, on a local or a remote Ray cluster


class EvalBackend(Protocol):
    capacity: int

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]], *, size: Size | None = None,
                       policy: PolicyName | None = None) -> list[EvalResult]: ...

    def profile(self, task: Task, *, size: Size | None = None) -> TaskProfile | None: ...

    def close(self) -> None: ...


def build_backend(kind: BackendKind, lanes: Sequence[EvalConfig], *, ray_address: str | None = None,
                  pool_name: str = "kernelrl") -> EvalBackend:
    """The backend of `kind` with one lane per evaluator config."""
    if kind is BackendKind.RAY:
        from kernelrl.serve.ray_backend import RayLanes

        return RayLanes(lanes, address=ray_address, pool_name=pool_name)
    from kernelrl.serve.lanes import LocalLanes

    return LocalLanes(lanes)
