"""How a batch's groups are scheduled (`kernelrl.judge.group.run_groups`): the places an evaluator
gives out are shared by every batch it is given at once, and what a group waited for them is its
`queued_s`. Stand-in groups (the scheduler only calls their steps in order) keep this test to the
scheduling."""

from __future__ import annotations

import contextlib
import threading
import time
from types import SimpleNamespace

from kernelrl.judge.context import Places
from kernelrl.judge.group import run_groups
from kernelrl.judge.harness.device import Device


class _Group:
    def __init__(self, ctx: SimpleNamespace, running: list[int], peak: list[int], guard: threading.Lock) -> None:
        self.ctx, self._running, self._peak, self._guard = ctx, running, peak, guard
        self.began = self.closed = 0.0

    def begin(self) -> None:
        self.began = time.monotonic()
        with self._guard:
            self._running[0] += 1
            self._peak[0] = max(self._peak[0], self._running[0])

    def workers_wanted(self) -> int:
        return 1

    def use_claim(self, claim: object) -> None:
        pass

    def prepare(self, checks: threading.Semaphore) -> None:
        with checks:
            time.sleep(0.05)

    def time(self) -> None:
        time.sleep(0.05)

    def finish(self) -> None:
        with self._guard:
            self._running[0] -= 1

    def close(self) -> None:
        self.closed = self.closed or time.monotonic()


def _context(places: Places | None) -> SimpleNamespace:
    return SimpleNamespace(places=places, pool=SimpleNamespace(claim=lambda n: contextlib.nullcontext(None)))


def _run_two_batches_at_once(places: Places | None) -> tuple[int, list[_Group]]:
    running, peak, guard = [0], [0], threading.Lock()
    ctx = _context(places)
    batches = [[_Group(ctx, running, peak, guard) for _ in range(4)] for _ in range(2)]
    threads = [threading.Thread(target=run_groups, args=(b,), kwargs={"device": Device.CPU, "width": 2})
               for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return peak[0], [g for b in batches for g in b]


def test_batches_given_at_once_share_the_evaluators_places():
    peak, groups = _run_two_batches_at_once(Places(device=Device.CPU, width=2))
    assert peak == 3  # width + 1 on a CPU, for both batches together
    assert all(g.closed for g in groups)


def test_without_shared_places_each_batch_has_its_own():
    peak, _ = _run_two_batches_at_once(None)
    assert peak == 6


def test_a_group_that_waits_for_its_place_counts_it_as_queued():
    from kernelrl.judge.group import Group
    from kernelrl.judge.grouprecord import GroupRecord

    phases: dict[str, float] = {}
    g = Group.__new__(Group)  # only its clock and phases: what `begin` reads and writes
    g.record = GroupRecord.__new__(GroupRecord)
    g.record.phases, g.record.lock_waits, g.record._clock = phases, [], time.monotonic() - 2.0
    g.begin()
    assert 2.0 <= phases["queued_s"] < 3.0
