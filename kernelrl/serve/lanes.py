"""Device lanes: one evaluator per device, so each GPU (or the CPU) is one timing lane.

- `parse_devices("cpu")`, `parse_devices("cuda:0,cuda:1")`: the lanes a server runs on. All lanes
  are of one kind (mixing CPU and GPU verdicts in one job would make rewards incomparable), and
  no device appears twice (two lanes on one device would time against each other).
- `lane_config(base, lane)`: the evaluator settings of one lane (the base settings, pinned to
  the lane's device).
- `LaneEvaluators`: the evaluators of one lane, one per (size, policy) asked for, made by
  `kernelrl.backends.judges.make_judge` on first use and kept warm.
- `LocalLanes`: a backend (`kernelrl.serve.backend.EvalBackend`) of in-process evaluators, one
  per lane. A batch is split into contiguous chunks, one per lane, run at once, and put back in
  order.

Each lane's evaluator holds its device's timing lane (`kernelrl.judge.timing.devicelock`), so several GPUs
measure at once and a CPU lane never overlaps another measurement on the same machine.

Does not isolate anything itself: every program under test runs in the evaluator's sandboxed
workers.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kernelrl.backends.judges import make_judge
from kernelrl.candidate import Candidate
from kernelrl.checks.policy import PolicyName
from kernelrl.judge.eval_config import EvalConfig
from kernelrl.judge.harness.device import Device
from kernelrl.judge.harness.profile import TaskProfile
from kernelrl.result import EvalResult
from kernelrl.tasks.task import Size, Task

if TYPE_CHECKING:
    from kernelrl.judge.contract import OwnedJudge

_LANE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


@dataclass(frozen=True, kw_only=True, slots=True)
class LaneSpec:
    device: Device
    index: int | None = None  # GPU number on this machine; None: the first visible one (or the CPU)

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", Device(self.device))
        if self.index is not None and (self.device is not Device.CUDA or self.index < 0):
            raise ValueError("only a cuda lane has an index, and it is >= 0")

    def __str__(self) -> str:
        return str(self.device) if self.index is None else f"{self.device}:{self.index}"


def parse_devices(spec: str | Sequence[str]) -> tuple[LaneSpec, ...]:
    """Lanes from `cpu`, `cuda`, `cuda:0,cuda:1` (a comma-separated string or a list of entries)."""
    entries = [e.strip() for part in ([spec] if isinstance(spec, str) else spec) for e in part.split(",")]
    entries = [e for e in entries if e]
    if not entries:
        raise ValueError("devices: name at least one device (cpu, cuda, or cuda:0,cuda:1,...)")
    lanes = []
    for entry in entries:
        m = _LANE.match(entry.lower())
        if not m:
            raise ValueError(f"devices: {entry!r} is not cpu, cuda or cuda:N")
        if m.group(1) == "cpu" and m.group(2) is not None:
            raise ValueError(f"devices: {entry!r}: the CPU is one lane (write cpu)")
        lanes.append(LaneSpec(device=Device(m.group(1)), index=None if m.group(2) is None else int(m.group(2))))
    if len({lane.device for lane in lanes}) > 1:
        raise ValueError("devices: all lanes must be of one kind (cpu or cuda), so every verdict is comparable")
    if len(set(lanes)) != len(lanes):
        raise ValueError(f"devices: a device is named twice in {','.join(entries)} (one timing lane per device)")
    if len(lanes) > 1 and any(lane.index is None for lane in lanes):
        raise ValueError("devices: with several GPUs, name each one (cuda:0,cuda:1,...)")
    return tuple(lanes)


def lane_config(base: EvalConfig, lane: LaneSpec) -> EvalConfig:
    """The evaluator settings of one lane: `base`, on the lane's device."""
    return dataclasses.replace(base, device=lane.device, device_index=lane.index)


def split_evenly(n: int, parts: int) -> list[range]:
    """`parts` contiguous ranges covering 0..n, sizes differing by at most one; empty ones dropped."""
    bounds = [i * n // parts for i in range(parts + 1)]
    return [range(a, b) for a, b in itertools.pairwise(bounds) if b > a]


class LaneEvaluators:
    """The evaluators of one lane: one per (size, policy), created on first use and kept warm."""

    def __init__(self, config: EvalConfig) -> None:
        self.config = config
        self._evaluators: dict[tuple[Size, PolicyName], OwnedJudge] = {}
        self._lock = threading.Lock()

    def evaluator(self, size: Size | None = None, policy: PolicyName | None = None) -> OwnedJudge:
        """The lane's in-process evaluator at `size` and `policy` (the lane's own where None); the
        evaluator and torch are imported when a lane first judges, not to read `devices`."""
        key = (Size(size or self.config.size), PolicyName(policy or self.config.policy))
        with self._lock:
            ev = self._evaluators.get(key)
            if ev is None:
                ev = make_judge(dataclasses.replace(self.config, size=key[0], policy=key[1]))
                self._evaluators[key] = ev
            return ev

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]], *, size: Size | None = None,
                       policy: PolicyName | None = None) -> list[EvalResult]:
        return self.evaluator(size, policy).evaluate_batch(items)

    def profile(self, task: Task, *, size: Size | None = None) -> TaskProfile | None:
        """What a reference worker read about the task (shapes, FLOPs, traits); TaskError if it fails."""
        return self.evaluator(size).profile(task)

    def close(self) -> None:
        with self._lock:
            evaluators, self._evaluators = list(self._evaluators.values()), {}
        for ev in evaluators:
            ev.close()


class LocalLanes:
    """In-process evaluators, one per lane; `evaluate_batch` spreads a batch over the lanes."""

    def __init__(self, configs: Sequence[EvalConfig]) -> None:
        if not configs:
            raise ValueError("LocalLanes needs at least one lane")
        self.lanes = [LaneEvaluators(c) for c in configs]
        self.capacity = len(self.lanes)
        self._next = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=4 * len(self.lanes), thread_name_prefix="kernelrl-lane")

    def __enter__(self) -> LocalLanes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]], *, size: Size | None = None,
                       policy: PolicyName | None = None) -> list[EvalResult]:
        items = list(items)
        if not items:
            return []
        chunks = split_evenly(len(items), len(self.lanes))
        # Rotate the first lane, so batches smaller than the number of lanes still use them all.
        with self._lock:
            start, self._next = self._next, (self._next + 1) % len(self.lanes)
        lanes = [self.lanes[(start + j) % len(self.lanes)] for j in range(len(chunks))]
        if len(chunks) == 1:
            return lanes[0].evaluate_batch(items, size=size, policy=policy)
        futures = [self._pool.submit(lane.evaluate_batch, [items[i] for i in chunk], size=size, policy=policy)
                   for lane, chunk in zip(lanes, chunks)]
        return [r for f in futures for r in f.result()]

    def profile(self, task: Task, *, size: Size | None = None) -> TaskProfile | None:
        with self._lock:
            lane, self._next = self.lanes[self._next], (self._next + 1) % len(self.lanes)
        return lane.profile(task, size=size)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for lane in self.lanes:
            lane.close()
