"""What every result of a group records about how it was obtained (`GroupRecord`): the setting it was
judged in, the machine, the reference's worker, the group's id, and where its wall time went.

Guarantees: every result of a group carries the same group id (`Environment.group`), told apart
from every other group's; phases add up the group's wall time from the moment it was made (the
wait for its place is `queued_s`), and each wait for the device's lock, from any thread, is
counted in `device_lock_wait_s` (each taken through `waited`).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager

from kernelrl.judge.context import JudgeContext
from kernelrl.judge.isolation.sandbox import timing_cores
from kernelrl.judge.timing import verdict as V
from kernelrl.judge.trial import Trial
from kernelrl.result import Environment, GroupPhases, MachineRecord, ReferenceRecord
from kernelrl.tasks.task import Task


@contextlib.contextmanager
def waited(lock: AbstractContextManager[object], waits: list[float]) -> Iterator[None]:
    """`lock` held, the time it took to get it appended to `waits`."""
    asked = time.monotonic()
    with lock:
        waits.append(time.monotonic() - asked)
        yield


class GroupRecord:
    """The setting, machine and reference records of one group, its id, the cores its members are
    timed on, and its phases (seconds by name) with the device lock's waits behind them."""

    def __init__(self, ctx: JudgeContext, task: Task) -> None:
        cfg = ctx.config
        self.setting = V.Setting(task=task.name, device=str(cfg.device), size=str(cfg.size), policy=cfg.policy,
                                 fingerprint=ctx.fingerprint, containment=ctx.pool.containment)
        self.cores = timing_cores(cfg.sandbox)
        self.machine = MachineRecord(threads=cfg.sandbox.effective_threads, device_lock=ctx.lock.name,
                                     timing_cores=tuple(sorted(self.cores or ())), allow_tf32=cfg.allow_tf32)
        self.reference = ReferenceRecord()
        self.gid = secrets.token_hex(6)  # told apart from every other group by its results (`Environment.group`)
        self.phases: dict[str, float] = {}  # where the group's wall time went, in seconds
        self.lock_waits: list[float] = []  # each wait for the device's lock (`waited`), from any thread
        self._clock = time.monotonic()

    def phase(self, name: str) -> None:
        """The time since the last phase, added to `name`."""
        now = time.monotonic()
        self.phases[name] = round(self.phases.get(name, 0.0) + now - self._clock, 3)
        self.phases["device_lock_wait_s"] = round(sum(self.lock_waits), 3)
        self._clock = now

    def environment(self) -> Environment:
        """What every result of this group records about how it was obtained (so far)."""
        return Environment(machine=self.machine, phases=GroupPhases(**self.phases), group=self.gid,
                           reference=self.reference)

    def note_check_times(self, members: Sequence[Trial], timed_reference: Trial | None, aa_copy: Trial | None,
                         compiled: Trial | None) -> None:
        """The checks' time by part, summed over the candidates' trials, and each of the task's own copies apart."""

        def own(t: Trial | None) -> float:
            return round(t.spans.wait_s + t.spans.load_s + t.spans.correctness_s, 3) if t is not None else 0.0

        self.phases.update(
            candidate_worker_wait_s=round(sum(t.spans.wait_s for t in members), 3),
            candidate_loads_s=round(sum(t.spans.load_s for t in members), 3),
            candidate_correctness_s=round(sum(t.spans.correctness_s for t in members), 3),
            timed_reference_checks_s=own(timed_reference), aa_copy_checks_s=own(aa_copy),
            compiled_reference_checks_s=own(compiled))
