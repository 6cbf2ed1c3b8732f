"""The reference side of an evaluation: a task's own program, run in a worker of its own.

A `ReferenceSession` holds one reference worker for one task during one batch. It loads the task
(resolving its size, running its module, `get_init_inputs` and `Model` in the worker), asks it
for input sets made from the judge's secret plans and for the reference's outputs on them, for
the timing pool, and for its parameters, so candidates can be given the same weights.

Guarantees:
- task code never runs in the judge's process: the judge receives constants, tensors and plain
  data; a task whose module, `get_init_inputs`, `get_inputs` or `Model` hangs, crashes or
  exhausts memory raises `ReferenceFailed` (a `TaskError`) within the session's deadline, with a
  one-line reason, and its worker is killed;
- the reference worker is never given a candidate, and no candidate worker ever receives a seed;
- a perturbed set that makes the reference non-finite is replaced by a plain one, so
  perturbation never makes a task unjudgeable.

Does not judge candidates: `kernelrl.judge.evaluator` does, with what this session returns.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernelrl.judge import protocol as P
from kernelrl.judge.channel import ChannelProtocolError, ChannelTimeout
from kernelrl.judge.device import Device, evict_bytes
from kernelrl.judge.eval_config import EvalConfig
from kernelrl.judge.inputs import InputPlan, correctness_plans, plain_plan
from kernelrl.judge.pool import Claim, WorkerPool
from kernelrl.judge.precision import PRECISION_FLAGS
from kernelrl.judge.profile import TaskProfile
from kernelrl.judge.sandbox import Answer, Worker, WorkerDied
from kernelrl.tasks.task import Task, TaskError


class ReferenceFailed(TaskError):
    """The task's own reference could not be loaded or run: a task problem, not a verdict."""


@dataclass(frozen=True, kw_only=True)
class TaskInfo:
    """What the judge learned about a task at one size (cached by the evaluator)."""

    constants: dict[str, int]
    profile: TaskProfile | None
    degenerate: tuple[str, ...] = ()  # reasons the reference's outputs ignore its inputs; () when not

    def to_dict(self) -> dict[str, Any]:
        return {"constants": dict(self.constants), "profile": self.profile.to_dict() if self.profile else None,
                "degenerate": list(self.degenerate)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskInfo:
        return cls(constants={k: int(v) for k, v in d["constants"].items()},
                   profile=TaskProfile.from_dict(d["profile"]) if d.get("profile") else None,
                   degenerate=tuple(d.get("degenerate") or ()))


@dataclass(kw_only=True)
class InputSet:
    plan: InputPlan
    values: list[object]
    output: object = None


@dataclass(kw_only=True)
class LoadSpec:
    """How workers of this task are set up (the judge's side of `protocol.LoadTask`)."""

    task: Task
    size: str
    overrides: dict[str, int] = field(default_factory=dict)
    device: Device = Device.CPU
    threads: int = 1
    init_seed: int = 0
    evict_bytes: int = 0
    cache_root: str = ""
    allow_tf32: bool = False  # the evaluation's fp32 precision (EvalConfig.allow_tf32), in every worker

    def header(self, *, profile: bool, compile_mode: str | None = None) -> P.LoadTask:
        return P.LoadTask(task_source=self.task.source, task_name=self.task.name, size=str(self.size),
                          presets=self.task.presets, overrides=dict(self.overrides), device=str(self.device),
                          threads=self.threads, init_seed=self.init_seed, evict_bytes=self.evict_bytes,
                          profile=profile, cache_root=self.cache_root, compile_mode=compile_mode,
                          allow_tf32=self.allow_tf32)


class ReferenceSession:
    def __init__(self, spec: LoadSpec, *, pool: WorkerPool, rng: random.Random, timeout_s: float) -> None:
        self.spec = spec
        self.task = spec.task
        self.rng = rng
        self.timeout_s = timeout_s
        self.worker: Worker | None = None
        self.pool = pool
        self.claim: Claim | None = None  # its group's (`WorkerPool.claim`): the take is counted against it
        self.constants: dict[str, int] = {}
        self.init_inputs: list[object] = []
        self.profile: TaskProfile | None = None
        self._state: dict[str, Any] | None = None
        self._state_fetched = False
        self.precision: dict[str, P.Setting] = {}

    def _deadline(self) -> float:
        return time.monotonic() + self.timeout_s

    def _ask(self, what: str, fn: Callable[[], Answer]) -> Answer:
        """Run one exchange with the reference worker; any failure is the task's."""
        try:
            answer = fn()
        except ChannelTimeout:
            self.close()
            raise ReferenceFailed(f"{self.task.name}: the reference did not finish {what} within "
                                  f"{self.timeout_s:g} s") from None
        except WorkerDied as e:
            self.close()
            raise ReferenceFailed(f"{self.task.name}: the reference worker died {what}: {e}") from e
        except ChannelProtocolError as e:
            self.close()
            raise ReferenceFailed(f"{self.task.name}: the reference broke the protocol {what}: {e}") from e
        if answer.failed:
            h = answer.header
            self.close()
            raise ReferenceFailed(f"{self.task.name}: the reference failed {what}: {_first_line(h.message)}",
                                  ) from None
        return answer

    def load(self, *, constants: dict[str, int] | None, profile: bool) -> None:
        self.worker = worker = self.pool.take("reference", deadline=self._deadline(), claim=self.claim)
        answer = self._ask("while loading", lambda: worker.request(
            self.spec.header(profile=profile), constants, deadline=self._deadline()))
        self.constants = dict(answer.header.constants)
        # the precision flags as the worker set them, before the task's code ran (recorded in results)
        self.precision = {k: answer.header.state_before[k] for k in PRECISION_FLAGS if k in answer.header.state_before}
        self.init_inputs = list(answer.payload or [])
        if answer.header.profile:
            self.profile = TaskProfile.from_dict(answer.header.profile)

    def make(self, plans: list[InputPlan], *, run: bool) -> tuple[list[list[object]], list[object], list[bool]]:
        """Input sets (and the reference's outputs on them), one set per message: the reference's
        worker holds one set at a time, and no message carries more than one."""
        worker = self.worker
        assert worker is not None
        values: list[list[object]] = []
        outputs: list[object] = []
        finite: list[bool] = []
        for plan in plans:
            answer = self._ask("making inputs", functools.partial(worker.request,
                P.MakeInputs(seeds=[plan.seed], perturb=[plan.perturb], run=run), deadline=self._deadline()))
            payload = answer.payload or {}
            values += list(payload.get("inputs") or [])
            outputs += list(payload.get("outputs") or [])
            finite += list(answer.header.finite)
        return values, outputs, finite

    def correctness_sets(self, n: int) -> list[InputSet]:
        """n sets (the first plain, the others perturbed) with the reference's outputs."""
        plans = correctness_plans(n, self.rng)
        values, outputs, finite = self.make(plans, run=True)
        if len(values) != n or len(outputs) != n:
            raise ReferenceFailed(f"{self.task.name}: the reference returned {len(values)} input sets for {n}")
        sets = [InputSet(plan=p, values=v, output=o) for p, v, o in zip(plans, values, outputs)]
        if not finite[0]:
            raise ReferenceFailed(f"{self.task.name}: the reference's output holds NaN or inf on its own inputs")
        bad = [i for i in range(1, n) if not finite[i]]
        if bad:
            plans2 = [plain_plan(self.rng) for _ in bad]
            values2, outputs2, finite2 = self.make(plans2, run=True)
            for i, p, v, o, ok in zip(bad, plans2, values2, outputs2, finite2):
                if not ok:
                    raise ReferenceFailed(f"{self.task.name}: the reference's output holds NaN or inf on its own "
                                          "inputs")
                sets[i] = InputSet(plan=p, values=v, output=o)
        return sets

    def timing_pool(self, n: int) -> list[list[object]]:
        values, _, _ = self.make([plain_plan(self.rng) for _ in range(n)], run=False)
        return values

    def state(self) -> dict[str, Any] | None:
        """The reference's parameters and buffers (None when it has none)."""
        if not self._state_fetched:
            worker = self.worker
            assert worker is not None
            answer = self._ask("handing over its parameters", lambda: worker.command(
                P.Kind.GET_STATE, deadline=self._deadline()))
            self._state = answer.payload or None
            self._state_fetched = True
        return self._state

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None


def session_for(task: Task, config: EvalConfig, *, pool: WorkerPool, rng: random.Random) -> ReferenceSession:
    """A reference session for `task` as the evaluator's config says (size, device, limits), with
    the model's init seed drawn from the group's secret generator."""
    spec = LoadSpec(task=task, size=config.size, overrides=dict(config.constants), device=config.device,
                    threads=config.sandbox.effective_threads, init_seed=rng.getrandbits(31),
                    evict_bytes=evict_bytes(config.device), cache_root=str(config.cache_dir),
                    allow_tf32=config.allow_tf32)
    return ReferenceSession(spec, pool=pool, rng=rng, timeout_s=config.timeout_s)


def _first_line(text: str) -> str:
    for line in (text or "").strip().splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""
