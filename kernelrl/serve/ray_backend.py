"""Scale-out on Ray: one actor per lane (per GPU, or the CPU lane), each holding warm evaluators.

`RayLanes(configs)` is a backend (`kernelrl.serve.backend.EvalBackend`): `evaluate_batch` spreads
a batch over the actors in contiguous chunks and returns the results in order, so the reward
server (`kernelrl serve --backend ray`) and a trainer (a run built with `judge=RayLanes(...)`, whose
`KernelRewardFunction` judges through it) submit to it alike.

- `ray.init()` with no address starts a local Ray (tests use `ray.init(num_cpus=2)` before
  building the lanes; an already initialised Ray is used as it is); `address="auto"` or
  `ray://host:port` joins a cluster.
- GPU lanes ask Ray for `num_gpus=1` each, so Ray places one actor per GPU and sets each actor's
  CUDA_VISIBLE_DEVICES; CPU lanes ask for one CPU. Actors are named `<pool>-lane-<i>` in the
  `kernelrl` namespace and looked up before being created, so several drivers of one cluster
  (a server and a trainer) share the same lanes; a lane found with other evaluator settings is
  refused (ValueError), never used silently.
- Lanes are detached: they belong to the cluster, not to the driver that created them, so they
  outlive it (a restarted server, a later trainer find them, warm, by name). `kill()` removes
  them; a local Ray that ends takes them with it.
- A lane found dead (its actor died past Ray's restarts, or was killed) is created again under
  its name, and the call it failed is sent once more to the new actor.
- Results cross Ray as `EvalResult.to_dict()` dictionaries, the same format the server stores.

Does not hold results across a lane's death: a batch that fails twice (on the old actor and on
the new one) raises, and the server's dispatcher retries it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import ActorDiedError

from kernelrl.candidate import Candidate
from kernelrl.checks.policy import PolicyName
from kernelrl.judge.evaluator import EvalConfig
from kernelrl.judge.harness.device import Device
from kernelrl.judge.harness.profile import TaskProfile
from kernelrl.result import EvalResult
from kernelrl.serve.lanes import LaneEvaluators, split_evenly
from kernelrl.tasks.task import Size, Task

if TYPE_CHECKING:
    from kernelrl.jsontypes import JSONObject

NAMESPACE = "kernelrl"


class LaneActor:
    """The Ray actor of one lane (wrapped with `ray.remote` by `RayLanes`)."""

    def __init__(self, config: EvalConfig) -> None:
        self.lane = LaneEvaluators(config)

    def evaluate_batch(self, items: list[tuple[Task, Candidate]], size: str | None, policy: str | None
                       ) -> list[JSONObject]:
        results = self.lane.evaluate_batch(items, size=Size(size) if size else None,
                                           policy=PolicyName(policy) if policy else None)
        return [r.to_dict() for r in results]

    def profile(self, task: Task, size: str | None) -> JSONObject | None:
        profile = self.lane.profile(task, size=Size(size) if size else None)
        return profile.to_dict() if profile else None

    def describe(self) -> JSONObject:
        import os

        return {"pid": os.getpid(), "device": str(self.lane.config.device),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "settings": settings(self.lane.config)}


def settings(config: EvalConfig) -> JSONObject:
    """What must agree for two drivers to share a lane: every setting but where caches live."""
    from kernelrl.config import to_dict

    d = to_dict(config)
    d.pop("cache_dir", None)
    return d


def _lane_config(config: EvalConfig) -> EvalConfig:
    # Ray sets CUDA_VISIBLE_DEVICES per actor: its GPU is its first visible one, and its device lock is
    # named after that GPU's entry there (devicelock.lock_name), so lanes on one node never share a lock.
    return dataclasses.replace(config, device_index=None) if config.device is Device.CUDA else config


class RayLanes:
    def __init__(self, configs: Sequence[EvalConfig], *, address: str | None = None, pool_name: str = "kernelrl",
                 max_restarts: int = 3) -> None:
        if not configs:
            raise ValueError("RayLanes needs at least one lane")
        if not ray.is_initialized():
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
        self.configs = [_lane_config(c) for c in configs]
        self.pool_name = pool_name
        self.max_restarts = max_restarts
        self._remote: Any = ray.remote(LaneActor)
        self._lock = threading.Lock()
        self.actors: list[Any] = [self._create(i) for i in range(len(self.configs))]
        # A pool found by name must judge as this driver asked, or rewards would silently differ.
        for i, (found, config) in enumerate(zip(self.describe(), self.configs)):
            wanted = settings(config)
            if found["settings"] != wanted:
                diff = sorted(k for k in wanted if found["settings"].get(k) != wanted[k])
                raise ValueError(f"Ray lane {self.lane_name(i)} already exists with other evaluator settings "
                                 f"({', '.join(diff)}); use another pool name or the same settings")
        self.capacity = len(self.actors)
        self._next = 0

    def lane_name(self, i: int) -> str:
        return f"{self.pool_name}-lane-{i}"

    def _create(self, i: int) -> Any:
        """Lane i's actor: the live one of that name, or a new one (detached: it outlives this driver)."""
        gpu = self.configs[i].device is Device.CUDA
        return self._remote.options(name=self.lane_name(i), namespace=NAMESPACE, get_if_exists=True,
                                    lifetime="detached", num_gpus=1 if gpu else 0, num_cpus=0 if gpu else 1,
                                    max_restarts=self.max_restarts, max_concurrency=8).remote(self.configs[i])

    def _replace(self, i: int, dead: Any) -> Any:
        """Lane i's actor after `dead` was found dead: a new one under the same name (once, however
        many threads found it dead)."""
        with self._lock:
            if self.actors[i] is dead:
                self.actors[i] = self._create(i)
            return self.actors[i]

    def _get(self, i: int, method: str, *args: object) -> Any:
        """`actor.method(*args)` on lane i, on a new actor when the lane is found dead."""
        actor = self.actors[i]
        try:
            return ray.get(getattr(actor, method).remote(*args))
        except ActorDiedError:
            return ray.get(getattr(self._replace(i, actor), method).remote(*args))

    def __enter__(self) -> RayLanes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> list[dict[str, Any]]:
        return [self._get(i, "describe") for i in range(len(self.actors))]

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]], *, size: Size | None = None,
                       policy: PolicyName | None = None) -> list[EvalResult]:
        pairs = [(task, Candidate(source=c) if isinstance(c, str) else c) for task, c in items]
        if not pairs:
            return []
        chunks = split_evenly(len(pairs), len(self.actors))
        with self._lock:  # rotate the first lane, so small batches still use every lane
            start, self._next = self._next, (self._next + 1) % len(self.actors)
        calls = []
        for j, chunk in enumerate(chunks):
            lane = (start + j) % len(self.actors)
            args = ([pairs[i] for i in chunk], str(size) if size else None, str(policy) if policy else None)
            actor = self.actors[lane]
            calls.append((lane, actor, args, actor.evaluate_batch.remote(*args)))
        out: list[EvalResult] = []
        for lane, actor, args, ref in calls:  # all chunks run at once; a dead lane's chunk runs again
            try:
                part = ray.get(ref)
            except ActorDiedError:
                part = ray.get(self._replace(lane, actor).evaluate_batch.remote(*args))
            out.extend(EvalResult.from_dict(d) for d in part)
        return out

    def profile(self, task: Task, *, size: Size | None = None) -> TaskProfile | None:
        with self._lock:
            lane, self._next = self._next, (self._next + 1) % len(self.actors)
        found = self._get(lane, "profile", task, str(size) if size else None)
        return TaskProfile.from_dict(found) if found else None

    def close(self) -> None:
        """Drop this driver's handles; the lanes stay (detached) for the next driver."""
        self.actors = []

    def kill(self) -> None:
        """Remove this pool's lanes from the cluster (their warm evaluators end with them)."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
