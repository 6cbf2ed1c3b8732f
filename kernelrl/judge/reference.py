"""The reference side of an evaluation: a task's own program, run in a worker of its own.

A `ReferenceSession` holds one reference worker for one task during one batch. It loads the task
(resolving its size, running its module, `get_init_inputs` and `Model` in the worker), asks it
for input sets made from the judge's secret plans and for the reference's outputs on them, for
the timing pool, and for its parameters, so candidates can be given the same weights. What the
load gave (constants, init arguments, profile, precision and settings) is its `TaskLoad`; the
judge's copies of its sets are kept by the rule of `kernelrl.judge.spill.SetCopies`.

A `ReferenceKeeper` keeps an evaluator's reference workers between batches (a search or a trainer
judges the same tasks again and again): the task's next session takes its worker and builds the
model again under its own secret init seed (`protocol.Reseed`) instead of starting an
interpreter and running the task's module again. A worker is kept only when nothing gave it a
history a fresh one would not have: it was never timed, its session did not fail, no process or
thread the task started after its load lives on, it used no CPU while it waited, and its global
settings are, when reseeded, the ones its load left (else a fresh worker loads the task); and
only for tasks whose input sets are small (`KEEP_MAX_SET_BYTES`).

Guarantees:
- task code never runs in the judge's process: the judge receives constants, tensors and plain
  data; a task whose module, `get_init_inputs`, `get_inputs` or `Model` hangs, crashes or
  exhausts memory raises `ReferenceFailed` (a `TaskError`) within the session's deadline, with a
  one-line reason, and its worker is killed;
- the reference worker is never given a candidate, and no candidate worker ever receives a seed;
  a kept worker serves only sessions of its own task (name, source, presets) in its own evaluator;
- a perturbed set that makes the reference non-finite is replaced by a plain one, so
  perturbation never makes a task unjudgeable.

Does not judge candidates: `kernelrl.judge.evaluator` does, with what this session returns.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelrl.judge.eval_config import EvalConfig
from kernelrl.judge.harness import protocol as P
from kernelrl.judge.harness.channel import ChannelProtocolError, ChannelTimeout
from kernelrl.judge.harness.device import Device, evict_bytes
from kernelrl.judge.harness.precision import PRECISION_FLAGS
from kernelrl.judge.harness.profile import TaskProfile
from kernelrl.judge.isolation.exchange import Answer
from kernelrl.judge.isolation.headers import shown_headers
from kernelrl.judge.isolation.pool import Claim, WorkerPool
from kernelrl.judge.isolation.sandbox import Worker, WorkerDied
from kernelrl.judge.spill import SPILL_SUBDIR, SetCopies, disk_free, folder_in_memory
from kernelrl.judge.timing.inputs import (
    InputPlan,
    available_memory,
    correctness_plans,
    memory_need,
    plain_plan,
    timing_pool_size,
    too_large,
)
from kernelrl.tasks.task import Task, TaskError

# The largest input set (with its outputs) whose task's worker is kept between sessions: a kept worker
# holds its model and last set, and a task at full size (GiBs a set) would hold them while other
# tasks are judged.
KEEP_MAX_SET_BYTES = 256 << 20


# The CPU a kept worker may use while it waits (an interpreter blocked on its pipe uses none): 1 ms,
# and a tenth of the time it waited; more means task code still runs in it (a thread it started),
# and it is not reused.
_KEPT_CPU_NS = 1_000_000
_KEPT_CPU_SHARE = 0.1


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
    headers_dir: str = ""  # the judge's precompiled headers shown to a program's builds; "": none
    allow_tf32: bool = False  # the evaluation's fp32 precision (EvalConfig.allow_tf32), in every worker

    def header(self, *, profile: bool, compile_mode: str | None = None) -> P.LoadTask:
        return P.LoadTask(task_source=self.task.source, task_name=self.task.name, size=str(self.size),
                          presets=self.task.presets, overrides=dict(self.overrides), device=str(self.device),
                          threads=self.threads, init_seed=self.init_seed, evict_bytes=self.evict_bytes,
                          profile=profile, cache_root=self.cache_root, compile_mode=compile_mode,
                          allow_tf32=self.allow_tf32)


@dataclass(frozen=True, kw_only=True)
class TaskLoad:
    """What the reference worker's load of the task (or a kept worker's reseed) gave the judge."""

    constants: dict[str, int] = field(default_factory=dict)
    init_inputs: list[object] = field(default_factory=list)
    profile: TaskProfile | None = None  # asked of a fresh load only
    precision: dict[str, P.Setting] = field(default_factory=dict)  # as the worker set them, before the task's code ran
    settings: dict[str, P.Setting] = field(default_factory=dict)  # the worker's global settings as its load left them
    threads: int | None = None  # its interpreter's threads when its load ended
    reseeded: bool = False  # the task was not loaded again: a kept worker was reseeded


@dataclass(frozen=True, kw_only=True)
class KeptReference:
    """A reference worker between two sessions of its task (`ReferenceKeeper`)."""

    worker: Worker
    precision: dict[str, P.Setting]  # as its load recorded them, before the task's code ran
    settings: dict[str, P.Setting]  # its global settings as its load left them
    threads: int  # its interpreter's threads when its load ended
    cpu_ns: int | None = None  # its CPU time when it was kept (`ReferenceKeeper.keep`)
    kept_at_ns: int = 0  # when it was kept (time.monotonic_ns)


class ReferenceKeeper:
    """An evaluator's reference workers kept between sessions, one per task, `size` at most (the
    oldest is closed first). Thread-safe; `close` ends every worker it holds."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._kept: OrderedDict[str, KeptReference] = OrderedDict()
        self._guard = threading.Lock()
        self._closed = False

    @staticmethod
    def _key(task: Task) -> str:
        return f"{task.name}|{task.source_hash}|{json.dumps(task.presets, sort_keys=True)}"

    def take(self, task: Task) -> KeptReference | None:
        """The task's kept worker, which no other session can take now; None when there is none,
        when its sandbox has ended (a forked worker outlives bubblewrap for the moment its PID
        namespace takes to end, and may still answer), or when it used the CPU while it waited
        (task code still running). Such a worker is closed."""
        with self._guard:
            kept = self._kept.pop(self._key(task), None)
        if kept is not None and (kept.worker.proc.poll() is not None or not _idle_since(kept)):
            kept.worker.close()
            return None
        return kept

    def release(self, task: Task, session: ReferenceSession) -> None:
        """Close `session`, keeping its worker for the task's next session where it may be kept."""
        kept = session.release()
        if kept is not None:
            self.keep(task, kept)

    def keep(self, task: Task, kept: KeptReference) -> None:
        """Hold `kept` for the task's next session; the oldest beyond `size` is closed."""
        key, drop = self._key(task), []
        kept = dataclasses.replace(kept, cpu_ns=kept.worker.cpu_time_ns(), kept_at_ns=time.monotonic_ns())
        with self._guard:
            if self._closed or self.size <= 0:
                drop.append(kept)
            else:
                if key in self._kept:  # two sessions of the task ran at once: the newer is kept
                    drop.append(self._kept.pop(key))
                self._kept[key] = kept
                while len(self._kept) > self.size:
                    drop.append(self._kept.popitem(last=False)[1])
        for k in drop:
            k.worker.close()

    def close(self) -> None:
        with self._guard:
            self._closed = True
            kept, self._kept = list(self._kept.values()), OrderedDict()
        for k in kept:
            k.worker.close()


def _idle_since(kept: KeptReference) -> bool:
    """Whether the kept worker used no more CPU than a waiting interpreter would since it was kept."""
    now, waited = kept.worker.cpu_time_ns(), time.monotonic_ns() - kept.kept_at_ns
    return (kept.cpu_ns is not None and now is not None
            and now - kept.cpu_ns <= _KEPT_CPU_NS + _KEPT_CPU_SHARE * waited)


class ReferenceSession:
    """One reference worker of one task for one group (see the module docstring): what its load gave
    (`loaded`), the judge's copies of its sets (`sets`), and whether its worker may be kept."""

    def __init__(self, spec: LoadSpec, *, pool: WorkerPool, rng: random.Random, timeout_s: float,
                 kept: KeptReference | None = None, spill_to: Path | None = None,
                 spill_bytes: int = 0) -> None:
        self.spec = spec
        # Where a set of `spill_bytes` or more (inputs and outputs) is kept as files (judge/spill.py);
        # None: every set stays in the judge's heap.
        self.sets = SetCopies(spill_to, spill_bytes)
        self.rng = rng
        self.timeout_s = timeout_s
        self.worker: Worker | None = None
        self.pool = pool
        self.claim: Claim | None = None  # its group's (`WorkerPool.claim`): the take is counted against it
        self.loaded = TaskLoad()  # nothing until `load`
        self._state: dict[str, Any] | None = None
        self._state_fetched = False
        self.kept = kept  # a worker that loaded this task for an earlier session, to reseed
        self.keepable = True  # nothing gave the worker a history its task's next session must not inherit

    @property
    def task(self) -> Task:
        return self.spec.task

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
        """Load the task in a worker: a kept one reseeded when the constants are known and no
        profile is asked, else a fresh one from the pool."""
        kept, self.kept = self.kept, None
        if kept is not None:
            if constants is not None and not profile and self._reseed(kept):
                return
            kept.worker.close()
        self.worker = worker = self.pool.take("reference", deadline=self._deadline(), claim=self.claim)
        answer = self._ask("while loading", lambda: worker.request(
            self.spec.header(profile=profile), constants, deadline=self._deadline()))
        h = answer.header
        self.loaded = TaskLoad(
            constants=dict(h.constants),
            # the precision flags as the worker set them, before the task's code ran (recorded in results)
            precision={k: h.state_before[k] for k in PRECISION_FLAGS if k in h.state_before},
            settings=dict(h.state_after), threads=worker.thread_count(), init_inputs=list(answer.payload or []),
            profile=TaskProfile.from_dict(h.profile) if h.profile else None)

    def _reseed(self, kept: KeptReference) -> bool:
        """Whether `kept` built the model again under this session's seed with its settings as its
        load left them; any failure says no (a fresh worker then loads the task, and that decides)."""
        try:
            answer = kept.worker.request(P.Reseed(init_seed=self.spec.init_seed), None, deadline=self._deadline())
        except (ChannelTimeout, WorkerDied, ChannelProtocolError, OSError):
            return False
        if answer.failed or dict(answer.header.state_before) != kept.settings:
            return False
        self.worker = kept.worker
        self.loaded = TaskLoad(constants=dict(answer.header.constants), precision=dict(kept.precision),
                               settings=dict(kept.settings), threads=kept.threads,
                               init_inputs=list(answer.payload or []), reseeded=True)
        return True

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
            # In files where a set that large goes, before the next set arrives: the judge's heap
            # holds one set at a time.
            made, ran = self.sets.arrived(list(payload.get("inputs") or []), list(payload.get("outputs") or []))
            values += made
            outputs += ran
            finite += list(answer.header.finite)
            del payload, answer  # the heap's copies of a spilled set go now, before the next arrives
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

    def release(self) -> KeptReference | None:
        """Close the session and hand over its worker (or the kept one it never used) where the
        task's next session may take it; None when there is none to keep."""
        kept, self.kept = self.kept, None
        load = self.loaded
        if (kept is None and self.worker is not None and self.keepable and self.sets.largest <= KEEP_MAX_SET_BYTES
                and load.threads is not None and self._quiet(self.worker, load.threads)):
            kept = KeptReference(worker=self.worker, precision=dict(load.precision), settings=dict(load.settings),
                                 threads=load.threads)
            self.worker = None
        self.close()
        return kept

    @staticmethod
    def _quiet(worker: Worker, threads: int) -> bool:
        """No process the task started lives on, and no thread it started since its load ended."""
        now = worker.thread_count()
        return now is not None and now <= threads and not worker.strays()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        if self.kept is not None:
            self.kept.worker.close()
            self.kept = None


def session_for(task: Task, config: EvalConfig, *, pool: WorkerPool, rng: random.Random,
                kept: KeptReference | None = None) -> ReferenceSession:
    """A reference session for `task` as the evaluator's config says (size, device, limits), with
    the model's init seed drawn from the group's secret generator (and `kept`, the task's kept
    worker, to reseed)."""
    spec = LoadSpec(task=task, size=config.size, overrides=dict(config.constants), device=config.device,
                    threads=config.sandbox.effective_threads, init_seed=rng.getrandbits(31),
                    evict_bytes=evict_bytes(config.device), cache_root=str(config.cache_dir),
                    headers_dir=shown_headers(config.headers_root), allow_tf32=config.allow_tf32)
    folder = config.cache_dir / SPILL_SUBDIR
    spill_to = None if config.spill_set_mib is None or folder_in_memory(config.cache_dir) else folder
    return ReferenceSession(spec, pool=pool, rng=rng, timeout_s=config.timeout_s, kept=kept, spill_to=spill_to,
                            spill_bytes=(config.spill_set_mib or 0) << 20)


def _first_line(text: str) -> str:
    for line in (text or "").strip().splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def check_size(config: EvalConfig, session: ReferenceSession, task: Task, profile: TaskProfile | None) -> None:
    """A task too large for this machine is a task error now, before any set is made or built."""
    p = profile
    if p is None or not (p.input_bytes or p.output_bytes):
        return
    folder = session.sets.files_for(p.input_bytes + p.output_bytes)
    in_files = folder is not None
    need = memory_need(input_bytes=p.input_bytes, output_bytes=p.output_bytes, param_bytes=p.param_bytes,
                       n_sets=config.n_correctness, n_inputs=len(p.inputs),
                       pool_size=timing_pool_size(config.timing.pool_size, p.input_bytes), in_files=in_files)
    cap = config.sandbox.memory_limit_gib
    why = too_large(need, available=available_memory(),
                    worker_cap=int(cap * (1 << 30)) if cap is not None and config.device is Device.CPU else None,
                    disk_free=disk_free(folder) if folder is not None else None)
    if why is not None:
        raise TaskError(f"{task.name}: {why}")
