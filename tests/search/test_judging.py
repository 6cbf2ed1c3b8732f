"""When the search sends a batch to the judge: the first batch waits for tasks still reading their
profiles, so it does not go out with one candidate while the others wait behind it; a streaming
judge takes the next batch while one runs, made of tasks with no group in it."""

from __future__ import annotations

import time
from types import SimpleNamespace

from kernelrl.search import judging as J


def _judging(*, profile_pending: bool, proposing: bool = False, batch_wait_s: float = 5.0, streams: bool = False):
    tasks = {"a": SimpleNamespace(profile_pending=False, task="task a"),
             "b": SimpleNamespace(profile_pending=profile_pending, task="task b")}
    run = SimpleNamespace(config=SimpleNamespace(batch_wait_s=batch_wait_s), tasks=tasks, stop_reason=None,
                          proposing=lambda: proposing)
    spawned: list[list] = []
    # the keys a batch was spawned with are what its handler is bound to (`on_batch(keys, out)`)
    workers = SimpleNamespace(eval_slots=1, batch_slots=4,
                              spawn=lambda name, slots, fn, on_done: spawned.append(on_done.args[0]))
    j = J.Judging(run, SimpleNamespace(), SimpleNamespace(), workers, evaluate_batch=lambda items: [], streams=streams)
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


def _pending(j: J.Judging, key: tuple[str, str]) -> None:
    j.evals_in_flight[key] = [SimpleNamespace(task=key[0], source="y", id=2)]
    j.eval_pending.append(key)


def test_a_streaming_judge_takes_the_next_batch_of_tasks_with_no_group_under_way():
    j, spawned = _judging(profile_pending=False, streams=True)
    j.start_batch()
    assert spawned == [[("a", "h")]]
    _pending(j, ("a", "h2"))  # task a's group is under way: its next candidate waits for its verdict
    _pending(j, ("b", "h3"))
    j.start_batch()
    assert spawned == [[("a", "h")], [("b", "h3")]] and j.eval_pending == [("a", "h2")] and j.batches_running == 2
    # task a's verdict streams in before its batch returns (here the evaluator's failure: nothing stored)
    j.out = SimpleNamespace(error=lambda *args: None)
    j.evals_in_flight[("a", "h")][0].chain = 0
    j.run.tasks["a"].chains = {0: SimpleNamespace(busy=True)}
    j.on_result(("a", "h"), RuntimeError("the evaluator broke"))
    j.start_batch()
    assert spawned[-1] == [("a", "h2")] and j.eval_pending == [] and j.batches_running == 3


def test_any_other_judge_takes_one_batch_at_a_time():
    j, spawned = _judging(profile_pending=False, streams=False)
    j.start_batch()
    _pending(j, ("b", "h3"))
    j.start_batch()
    assert spawned == [[("a", "h")]] and j.eval_pending == [("b", "h3")]
    j.evals_in_flight.pop(("a", "h"))  # its verdict streamed in and was stored
    j.on_batch([("a", "h")], [])  # the batch is over
    j.start_batch()
    assert spawned[-1] == [("b", "h3")]
