"""The job store: acceptance, exactly-once completion, idempotency keys, the bound, recovery."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from serve_helpers import fake_result

from kernelrl.checks.policy import PolicyName
from kernelrl.result import EvalResult, Status
from kernelrl.serve.jobs import ItemSpec, JobState, JobStore, KeyConflict, QueueFull
from kernelrl.tasks.task import Size, Task

TASK = Task(name="t", source="import torch\nclass Model: pass\ndef get_inputs(): return []\n"
                             "def get_init_inputs(): return []\n", level=1, presets={"small": {"n": 4}})


def items(*cands: str, keys: tuple[str | None, ...] = ()) -> list[ItemSpec]:
    keys = keys or (None,) * len(cands)
    return [ItemSpec(task=TASK, candidate=c, key=k) for c, k in zip(cands, keys)]


def submit(store: JobStore, specs: list[ItemSpec], *, limit: int = 100, size: Size = Size.SMALL,
           policy: PolicyName = PolicyName.OPEN):
    return store.submit(specs, size=size, policy=policy, max_pending=limit)


def run_job(store: JobStore) -> str:
    """Claim the oldest job and complete it with fake verdicts."""
    job = store.claim()
    assert job is not None
    assert store.complete(job.seq, [(idx, fake_result(task.name, cand)) for idx, task, cand in job.items])
    return job.job_id


def test_submit_claim_complete_in_order(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    sub = submit(store, items("a", "b", "c"))
    assert (sub.n_items, sub.reused, sub.state) == (3, 0, JobState.QUEUED)
    assert store.job(sub.job_id).state is JobState.QUEUED
    job = store.claim()
    assert job.job_id == sub.job_id and job.attempts == 1 and [c for _, _, c in job.items] == ["a", "b", "c"]
    # The task comes back whole: source, level and presets (the small size depends on them).
    assert job.items[0][1] == TASK and job.items[0][1].presets == TASK.presets and job.items[0][1].level == 1
    assert store.job(sub.job_id).state is JobState.RUNNING
    assert store.claim() is None
    assert store.complete(job.seq, [(i, fake_result("t", c)) for i, _, c in job.items])
    view = store.job(sub.job_id)
    assert view.state is JobState.DONE
    assert [r["message"] for r in view.results] == [fake_result("t", c).message for c in "abc"]
    assert EvalResult.from_dict(view.results[1]).to_dict() == view.results[1]


def test_completion_happens_once(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    sub = submit(store, items("a"))
    job = store.claim()
    first = fake_result("t", "a")
    assert store.complete(job.seq, [(0, first)])
    other = EvalResult(task="t", status=Status.INCORRECT, message="a second verdict")
    assert not store.complete(job.seq, [(0, other)])
    assert store.job(sub.job_id).results[0]["message"] == first.message


def test_missing_result_writes_nothing(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    sub = submit(store, items("a", "b"))
    job = store.claim()
    with pytest.raises(ValueError, match="1 results for its 2 items"):
        store.complete(job.seq, [(0, fake_result("t", "a"))])
    view = store.job(sub.job_id)
    assert view.state is JobState.RUNNING and view.results == [None, None]


def test_key_returns_first_result_and_is_not_evaluated_again(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    first = submit(store, items("a", "b", keys=("k-a", "k-b")))
    run_job(store)
    again = submit(store, items("b", "c", keys=("k-b", None)))
    assert (again.reused, again.state) == (1, JobState.QUEUED)
    job = store.claim()
    assert [c for _, _, c in job.items] == ["c"]  # only the new item is evaluated
    store.complete(job.seq, [(1, fake_result("t", "c"))])
    view = store.job(again.job_id)
    assert view.state is JobState.DONE
    assert view.results[0] == store.job(first.job_id).results[1]
    # Every item answered from a key: done at once, nothing queued, even with the queue full.
    only = submit(store, items("a", keys=("k-a",)), limit=1)
    assert only.state is JobState.DONE and store.claim() is None


def test_job_waiting_on_a_key_follows_the_first_job(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    first = submit(store, items("a", keys=("k",)))
    second = submit(store, items("a", keys=("k",)))
    assert store.job(second.job_id).state is JobState.QUEUED
    job = store.claim()
    assert job.job_id == first.job_id
    assert store.job(second.job_id).state is JobState.RUNNING
    store.complete(job.seq, [(0, fake_result("t", "a"))])
    assert store.job(second.job_id).state is JobState.DONE
    assert store.job(second.job_id).results == store.job(first.job_id).results


def test_key_reused_for_something_else_is_refused(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    submit(store, items("a", keys=("k",)))
    for specs, kw in ((items("other", keys=("k",)), {}), (items("a", keys=("k",)), {"size": Size.FULL}),
                      (items("a", keys=("k",)), {"policy": PolicyName.STRICT})):
        with pytest.raises(KeyConflict, match="'k'"):
            submit(store, specs, **kw)
    assert store.stats(since=0).jobs[JobState.QUEUED] == 1  # nothing stored by the refused ones


def test_queue_bound_counts_pending_evaluations(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    submit(store, items("a", "b"), limit=3)
    with pytest.raises(QueueFull) as e:
        submit(store, items("c", "d"), limit=3)
    assert (e.value.pending, e.value.wanted, e.value.limit) == (2, 2, 3)
    submit(store, items("c"), limit=3)
    run_job(store)
    submit(store, items("d", "e"), limit=3)  # the finished job no longer counts
    assert store.pending_items() == 3


def test_recover_queues_running_jobs_again_and_counts_attempts(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = JobStore(path)
    done = submit(store, items("a"))
    run_job(store)
    running = submit(store, items("b"))
    assert store.claim().job_id == running.job_id
    store.close()  # the server dies here

    store = JobStore(path)
    assert store.recover() == 1
    assert store.job(running.job_id).state is JobState.QUEUED
    job = store.claim()
    assert job.job_id == running.job_id and job.attempts == 2
    assert store.job(done.job_id).state is JobState.DONE  # finished jobs are never run again
    assert store.claim() is None


def test_requeue_after_backend_failure(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    sub = submit(store, items("a"))
    job = store.claim()
    assert store.requeue(job.seq)
    assert not store.requeue(job.seq)  # only a running job goes back
    assert store.claim().job_id == sub.job_id


def test_accepted_job_is_on_disk_before_submit_returns(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = JobStore(path)
    sub = submit(store, items("a", "b"))
    # Another connection (another process, after a crash) sees the job at once.
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT n_items, state FROM jobs WHERE id = ?", (sub.job_id,)).fetchone() == (2, "queued")


def test_stats(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    submit(store, items("a", "b"))
    run_job(store)
    submit(store, items("c"))
    stats = store.stats(since=0)
    assert stats.jobs == {JobState.QUEUED: 1, JobState.RUNNING: 0, JobState.DONE: 1}
    assert stats.pending_items == {JobState.QUEUED: 1, JobState.RUNNING: 0}
    assert stats.by_status == {"correct": 2} and stats.finished_since == 2
