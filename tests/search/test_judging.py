"""When the search sends a batch to the judge: the first batch waits for tasks still reading their
profiles, so it does not go out with one candidate while the others wait behind it."""

from __future__ import annotations

import time
from types import SimpleNamespace

from kernelrl.search import judging as J


def _judging(*, profile_pending: bool, proposing: bool = False, batch_wait_s: float = 5.0):
    tasks = {"a": SimpleNamespace(profile_pending=False, task="task a"),
             "b": SimpleNamespace(profile_pending=profile_pending, task="task b")}
    run = SimpleNamespace(config=SimpleNamespace(batch_wait_s=batch_wait_s), tasks=tasks, stop_reason=None,
                          proposing=lambda: proposing)
    spawned: list[list] = []
    # the keys a batch was spawned with are what its handler is bound to (`on_batch(keys, out)`)
    workers = SimpleNamespace(eval_slots=1, spawn=lambda name, slots, fn, on_done: spawned.append(on_done.args[0]))
    j = J.Judging(run, SimpleNamespace(), SimpleNamespace(), workers, evaluate_batch=lambda items: [])
    j.evals_in_flight[("a", "h")] = [SimpleNamespace(task="a", source="x", id=1)]
    j.eval_pending.append(("a", "h"))
    return j, spawned


def test_a_batch_waits_while_another_task_reads_its_profile():
    j, spawned = _judging(profile_pending=True)
    j.pending_since = time.monotonic() - 6.0  # past batch_wait_s
    j.start_batch()
    assert spawned == [] and j.eval_pending == [("a", "h")]


def test_without_pending_profiles_a_batch_goes_once_no_model_call_is_under_way():
    j, spawned = _judging(profile_pending=False)
    j.pending_since = time.monotonic()
    j.start_batch()
    assert spawned == [[("a", "h")]] and j.batch_running


def test_the_wait_for_profiles_is_bounded():
    j, spawned = _judging(profile_pending=True)
    j.pending_since = time.monotonic() - (5.0 + J.PROFILE_HOLD_S + 1.0)
    j.start_batch()
    assert spawned == [[("a", "h")]]


def test_a_model_call_under_way_holds_a_batch_only_for_batch_wait_s():
    j, spawned = _judging(profile_pending=False, proposing=True)
    j.pending_since = time.monotonic()
    j.start_batch()
    assert spawned == []
    j.pending_since = time.monotonic() - 6.0
    j.start_batch()
    assert spawned == [[("a", "h")]]
