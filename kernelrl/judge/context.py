"""What a group of candidates is judged with: the evaluator's parts, handed over explicitly.

A `JudgeContext` is built once by the evaluator (`kernelrl.judge.evaluator`) and given to every
group (`kernelrl.judge.group`) and calibration run (`kernelrl.judge.calibration`): the config, the
pool of warm workers, the device's lock, the secret generator, the task-information store, the
baselines, the machine's peaks, the optional LLM reviewer and, on a GPU, the idle probe
(`kernelrl.judge.timing.idle`). Nothing judged reaches into the
evaluator: a group can be built from a context alone, read alone and tested alone.

Guarantees:
- `Secrets.generator()` hands out generators seeded from one secret drawn from the OS at start;
  the seed never leaves this process (no program under test, no log, no result sees it);
- `TaskStore` keeps what the judge learned about a task (constants at the judged size, profile,
  degeneracy, and its A/A noise band once calibrated) in memory and on disk, keyed by the task's
  source, the size, its presets and the explicit overrides, written atomically; a damaged or
  older file is ignored (learned again).

Does not run anything itself: the group and the reference session do.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path

from kernelrl.checks.llm_judge import LLMJudge
from kernelrl.judge.eval_config import EvalConfig
from kernelrl.judge.harness.device import Device
from kernelrl.judge.isolation.pool import WorkerPool
from kernelrl.judge.reference import ReferenceKeeper, TaskInfo
from kernelrl.judge.timing.baseline import BaselineStore
from kernelrl.judge.timing.devicelock import DeviceLock
from kernelrl.judge.timing.idle import IdleMonitor
from kernelrl.judge.timing.roofline import PeakStore
from kernelrl.tasks.task import Task

# Task information is cached on disk per task source, size and overrides; bump when what it holds
# (constants resolution, profile fields, degeneracy rules) changes meaning.
TASK_INFO_VERSION = 2  # 2: sizes also shrink tuple elements, literals, and count FLOPs


class Secrets:
    """The judge's secret: generators for groups, seeded from one draw of the OS's randomness."""

    def __init__(self) -> None:
        self._rng = random.Random(secrets.randbits(128))
        self._guard = threading.Lock()

    def generator(self) -> random.Random:
        """A fresh generator for one group (its input plans, order, spot checks, seeds)."""
        with self._guard:
            return random.Random(self._rng.getrandbits(128))


class TaskStore:
    """What the judge learned about each task at the evaluator's size (see the module docstring)."""

    def __init__(self, config: EvalConfig) -> None:
        self._size = str(config.size)
        self._constants = json.dumps(config.constants, sort_keys=True)
        self._folder = Path(config.cache_dir) / "tasks"
        self._known: dict[str, TaskInfo] = {}
        self._guard = threading.Lock()

    def key(self, task: Task) -> str:
        """The task at this size: its source, the size, its presets for the size, the overrides."""
        presets = json.dumps(task.presets.get(self._size, {}), sort_keys=True)
        text = f"{task.source_hash}|{self._size}|{presets}|{self._constants}"
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def get(self, task: Task) -> TaskInfo | None:
        key = self.key(task)
        with self._guard:
            if key in self._known:
                return self._known[key]
        try:
            info = TaskInfo.from_dict(json.loads(self._path(key).read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        with self._guard:
            self._known[key] = info
        return info

    def put(self, task: Task, info: TaskInfo) -> None:
        key = self.key(task)
        with self._guard:
            self._known[key] = info
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(info.to_dict()))
        tmp.replace(path)

    def band(self, task: Task, fingerprint: str) -> tuple[float, float] | None:
        """The task's A/A noise band under an evaluator config (`kernelrl.judge.calibration`), if calibrated."""
        try:
            lo, hi = json.loads(self._band_path(self.key(task), fingerprint).read_text())["band"]
            return float(lo), float(hi)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put_band(self, task: Task, fingerprint: str, band: tuple[float, float]) -> None:
        path = self._band_path(self.key(task), fingerprint)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps({"task": task.name, "band": list(band)}))
        tmp.replace(path)

    def _path(self, key: str) -> Path:
        return self._folder / f"{key}-v{TASK_INFO_VERSION}.json"

    def _band_path(self, key: str, fingerprint: str) -> Path:
        # the band belongs to this machine (the cache folder) and the timing settings (the fingerprint)
        return self._folder / f"{key}-band-{fingerprint}.json"


class Places:
    """How many groups are judged at once and how many trials check at once, shared by every batch
    an evaluator is given at the same time (a search's next batch starts while the last one's slowest
    groups finish; a server's requests arrive together): on a CPU one group more than `width`, so
    that while one is timed (holding the machine) `width` others are ready to check as soon as it is
    done. A group waits for its place in the order it asked (`threading.Semaphore`'s waiters are
    woken first come, first served)."""

    def __init__(self, *, device: Device, width: int) -> None:
        self.checks = threading.Semaphore(max(1, width))
        self.groups = threading.Semaphore(max(1, width) + (1 if device == Device.CPU else 0))


@dataclass(frozen=True, kw_only=True)
class JudgeContext:
    """The evaluator's parts a group is judged with (see the module docstring)."""

    config: EvalConfig
    fingerprint: str  # of `config` (`kernelrl.judge.eval_config.config_fingerprint`)
    pool: WorkerPool
    lock: DeviceLock
    secrets: Secrets
    tasks: TaskStore
    baselines: BaselineStore
    peaks: PeakStore
    reviewer: LLMJudge | None = None
    idle: IdleMonitor | None = None  # on a GPU: the device confirmed idle after every timed sample
    # reference workers kept between groups of a task (the evaluator's: `EvalConfig.kept_references`)
    references: ReferenceKeeper = field(default_factory=lambda: ReferenceKeeper(size=0))
    places: Places | None = None  # the evaluator's, shared by its batches; None: each batch its own
