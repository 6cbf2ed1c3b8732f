"""Scale-out on Ray: one actor per lane (per GPU, or the CPU lane), each holding warm evaluators.

`RayLanes(configs)` is a backend (`kernelrl.serve.backend.EvalBackend`): `evaluate_batch` spreads
a batch over the actors in contiguous chunks and returns the results in order, so the reward
server (`kernelrl serve --backend ray`) and a trainer (`KernelRewardFunction(RayLanes(...))`)
submit to it alike.

- `ray.init()` with no address starts a local Ray (tests use `ray.init(num_cpus=2)` before
  building the lanes; an already initialised Ray is used as it is); `address="auto"` or
  `ray://host:port` joins a cluster.
- GPU lanes ask Ray for `num_gpus=1` each, so Ray places one actor per GPU and sets each actor's
  CUDA_VISIBLE_DEVICES; CPU lanes ask for one CPU. Actors are named `<pool>-lane-<i>` in the
  `kernelrl` namespace and looked up before being created, so several drivers of one cluster
  (a server and a trainer) share the same lanes; a lane found with other evaluator settings is
  refused (ValueError), never used silently.
- Results cross Ray as `EvalResult.to_dict()` dictionaries, the same format the server stores.

Does not restart a lane inside a call: an actor that dies fails the batch (the server's
dispatcher retries it); Ray restarts the actor for the next call (`max_restarts`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import ray

from kernelrl.candidate import Candidate
from kernelrl.checks.policy import PolicyName
from kernelrl.judge.device import Device
from kernelrl.judge.evaluator import EvalConfig
from kernelrl.judge.profile import TaskProfile
from kernelrl.result import EvalResult
from kernelrl.serve.lanes import LaneEvaluators, split_evenly
from kernelrl.tasks.task import Size, Task

NAMESPACE = "kernelrl"


class LaneActor:
    """The Ray actor of one lane (wrapped with `ray.remote` by `RayLanes`)."""

    def __init__(self, config: EvalConfig) -> None:
        self.lane = LaneEvaluators(config)

    def evaluate_batch(self, items: list[tuple[Task, Candidate]], size: str | None, policy: str | None
                       ) -> list[dict[str, Any]]:
        results = self.lane.evaluate_batch(items, size=Size(size) if size else None,
                                           policy=PolicyName(policy) if policy else None)
        return [r.to_dict() for r in results]

    def profile(self, task: Task, size: str | None) -> dict[str, Any] | None:
        profile = self.lane.profile(task, size=Size(size) if size else None)
        return profile.to_dict() if profile else None

    def describe(self) -> dict[str, Any]:
        import os

        return {"pid": os.getpid(), "device": str(self.lane.config.device),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "settings": settings(self.lane.config)}


def settings(config: EvalConfig) -> dict[str, Any]:
    """What must agree for two drivers to share a lane: every setting but where caches live."""
    from kernelrl.config import to_dict

    d = to_dict(config)
    d.pop("cache_dir", None)
    return d


class RayLanes:
    def __init__(self, configs: Sequence[EvalConfig], *, address: str | None = None, pool_name: str = "kernelrl",
                 max_restarts: int = 3) -> None:
        if not configs:
            raise ValueError("RayLanes needs at least one lane")
        if not ray.is_initialized():
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
        remote = ray.remote(LaneActor)
        self.actors = []
        for i, config in enumerate(configs):
            gpu = config.device is Device.CUDA
            # Ray sets CUDA_VISIBLE_DEVICES per actor: its GPU is its first visible one.
            config = dataclasses.replace(config, device_index=None) if gpu else config
            actor = remote.options(name=f"{pool_name}-lane-{i}", namespace=NAMESPACE, get_if_exists=True,
                                   num_gpus=1 if gpu else 0, num_cpus=0 if gpu else 1,
                                   max_restarts=max_restarts, max_concurrency=8).remote(config)
            self.actors.append(actor)
        # A pool found by name must judge as this driver asked, or rewards would silently differ.
        for i, (found, config) in enumerate(zip(self.describe(), configs)):
            wanted = settings(dataclasses.replace(config, device_index=None) if config.device is Device.CUDA
                              else config)
            if found["settings"] != wanted:
                diff = sorted(k for k in wanted if found["settings"].get(k) != wanted[k])
                raise ValueError(f"Ray lane {pool_name}-lane-{i} already exists with other evaluator settings "
                                 f"({', '.join(diff)}); use another pool name or the same settings")
        self.capacity = len(self.actors)
        self._next = 0
        self._lock = threading.Lock()

    def __enter__(self) -> RayLanes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> list[dict[str, Any]]:
        return ray.get([a.describe.remote() for a in self.actors])

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]], *, size: Size | None = None,
                       policy: PolicyName | None = None) -> list[EvalResult]:
        pairs = [(task, Candidate(source=c) if isinstance(c, str) else c) for task, c in items]
        if not pairs:
            return []
        chunks = split_evenly(len(pairs), len(self.actors))
        with self._lock:  # rotate the first lane, so small batches still use every lane
            start, self._next = self._next, (self._next + 1) % len(self.actors)
        refs = [self.actors[(start + j) % len(self.actors)].evaluate_batch.remote(
                    [pairs[i] for i in chunk], str(size) if size else None, str(policy) if policy else None)
                for j, chunk in enumerate(chunks)]
        return [EvalResult.from_dict(d) for part in ray.get(refs) for d in part]

    def profile(self, task: Task, *, size: Size | None = None) -> TaskProfile | None:
        with self._lock:
            actor, self._next = self.actors[self._next], (self._next + 1) % len(self.actors)
        found = ray.get(actor.profile.remote(task, str(size) if size else None))
        return TaskProfile.from_dict(found) if found else None

    def close(self) -> None:
        """Drop this driver's handles. Named actors live as long as the driver that created them."""
        self.actors = []
