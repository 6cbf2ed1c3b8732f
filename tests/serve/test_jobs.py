"""The job store: acceptance, exactly-once completion, idempotency keys, the bound, recovery."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest
from serve_helpers import fake_result

from kernelrl.backends.api import JobState
from kernelrl.checks.policy import PolicyName
from kernelrl.result import EvalResult, Status
from kernelrl.serve.jobs import ItemSpec, JobStore, KeyConflict, QueueFull
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
                      (items("a", keys=("k",)), {"policy": PolicyName.STRICT}),
                      ([ItemSpec(task=dataclasses.replace(TASK, presets={"small": {"batch_size": 2}}), candidate="a",
                                 key="k")], {})):
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
    assert stats.jobs == {JobState.QUEUED: 1, JobState.RUNNING: 0, JobState.DONE: 1, JobState.FAILED: 0}
    assert stats.pending_items == {JobState.QUEUED: 1, JobState.RUNNING: 0}
    assert stats.by_status == {"correct": 2} and stats.finished_since == 2


def test_a_failed_job_says_why_and_frees_its_keys(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    sub = submit(store, items("a", keys=("k",)))
    follower = submit(store, items("a", keys=("k",)))  # waits on the first job's result
    job = store.claim()
    assert store.fail(job.seq, "disk full")
    assert not store.fail(job.seq, "again") and not store.complete(job.seq, [(0, fake_result("t", "a"))])
    view = store.job(sub.job_id)
    assert (view.state, view.error, view.results) == (JobState.FAILED, "disk full", [None])
    assert view.finished_s is not None and store.pending_items() == 0
    assert store.job(follower.job_id).state is JobState.FAILED and "disk full" in store.job(follower.job_id).error
    # The key is free again: a retry is judged, not answered with the failure.
    retry = submit(store, items("a", keys=("k",)))
    assert retry.reused == 0 and store.claim().job_id == retry.job_id


def test_jobs_and_keys_belong_to_their_owner(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    alice = store.submit(items("a", keys=("k",)), size=Size.SMALL, policy=PolicyName.OPEN, max_pending=10, owner="alice")
    assert store.state(alice.job_id, owner="alice") is JobState.QUEUED
    assert store.state(alice.job_id, owner="bob") is None and store.job(alice.job_id, owner="bob") is None
    assert store.state(alice.job_id) is None  # nor to a server without tokens
    # bob's "k" is another key (no conflict, nothing reused); alice's "k" is hers.
    bob = store.submit(items("other", keys=("k",)), size=Size.SMALL, policy=PolicyName.OPEN, max_pending=10, owner="bob")
    assert bob.reused == 0
    with pytest.raises(KeyConflict):
        store.submit(items("other", keys=("k",)), size=Size.SMALL, policy=PolicyName.OPEN, max_pending=10, owner="alice")


def test_the_database_is_private(tmp_path: Path) -> None:
    import stat

    path = tmp_path / "s.db"
    store = JobStore(path)
    submit(store, items("a"))
    run_job(store)
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    store.close()
    path.chmod(0o644)  # made by an older server
    JobStore(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_purge_removes_old_finished_jobs_only(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    old = submit(store, items("a"))
    run_job(store)
    origin = submit(store, items("b", keys=("kb",)))  # old, but its result is reused by a kept job
    run_job(store)
    failed = submit(store, items("c"))
    store.fail(store.claim().seq, "disk full")
    pending = submit(store, items("d"))  # old but not finished
    store._db.execute("UPDATE jobs SET created_s = 0, finished_s = CASE WHEN finished_s IS NULL THEN NULL ELSE 1 END")
    reuser = submit(store, items("b", keys=("kb",)))  # recent: keeps `origin`
    assert store.purge(finished_before_s=1000) == 2
    assert store.job(old.job_id) is None and store.job(failed.job_id) is None
    assert store.job(pending.job_id).state is JobState.QUEUED
    assert store.job(reuser.job_id).results == store.job(origin.job_id).results != [None]
    assert store._db.execute("SELECT COUNT(*) FROM items WHERE job_seq NOT IN (SELECT seq FROM jobs)").fetchone() == (0,)
    assert store.purge(finished_before_s=1000) == 0


FIRST_SCHEMA = """
CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done')), size TEXT NOT NULL, policy TEXT NOT NULL,
    n_items INTEGER NOT NULL, n_eval INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, created_s REAL NOT NULL,
    started_s REAL, finished_s REAL);
CREATE INDEX jobs_state ON jobs (state, seq);
CREATE TABLE items (job_seq INTEGER NOT NULL REFERENCES jobs (seq), idx INTEGER NOT NULL, task TEXT NOT NULL,
    task_hash TEXT NOT NULL, candidate TEXT NOT NULL, candidate_hash TEXT NOT NULL, key TEXT, origin_seq INTEGER,
    origin_idx INTEGER, status TEXT, result TEXT, finished_s REAL, PRIMARY KEY (job_seq, idx));
CREATE UNIQUE INDEX items_key ON items (key) WHERE key IS NOT NULL AND origin_seq IS NULL;
CREATE INDEX items_status ON items (status);
CREATE INDEX items_finished ON items (finished_s);
"""


def test_a_database_of_the_first_schema_is_migrated_with_its_jobs(tmp_path: Path) -> None:
    from kernelrl.serve.jobs import _sha, task_to_json

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.executescript(FIRST_SCHEMA)
        db.execute("INSERT INTO jobs (id, state, size, policy, n_items, n_eval, created_s, finished_s) "
                   "VALUES ('0' || hex(randomblob(15)), 'done', 'small', 'open', 1, 1, 1.0, 2.0)")
        db.execute("INSERT INTO jobs (id, state, size, policy, n_items, n_eval, created_s) "
                   "VALUES ('f' || hex(randomblob(15)), 'running', 'small', 'open', 1, 1, 3.0)")
        for seq, key, result in ((1, "k-done", json.dumps(fake_result("t", "a").to_dict())), (2, None, None)):
            db.execute("INSERT INTO items (job_seq, idx, task, task_hash, candidate, candidate_hash, key, result) "
                       "VALUES (?, 0, ?, ?, 'a', ?, ?, ?)", (seq, task_to_json(TASK), _sha(TASK.source), _sha("a"),
                                                            key, result))
        ids = [r[0] for r in db.execute("SELECT id FROM jobs ORDER BY seq")]
    store = JobStore(path)
    assert store._db.execute("PRAGMA user_version").fetchone() == (3,)  # 2: these jobs; 3: sessions beside them
    done = store.job(ids[0])
    assert done.state is JobState.DONE and done.results[0]["message"] == fake_result("t", "a").message
    assert store.recover() == 1 and store.claim().job_id == ids[1]
    # The stored key still answers; the new states work on old jobs.
    assert submit(store, items("a", keys=("k-done",))).state is JobState.DONE
    assert store.fail(2, "disk full") and store.job(ids[1]).state is JobState.FAILED
    store.close()
    JobStore(path).close()  # opening again does nothing more
