"""The dispatcher: jobs to backend calls, retries after backend failures, nothing stuck for ever."""

from __future__ import annotations

import time
from pathlib import Path

from serve_helpers import FakeBackend, fake_result

from kernelrl.backends.api import JobState
from kernelrl.checks.policy import PolicyName
from kernelrl.result import Status
from kernelrl.serve.dispatch import Dispatcher
from kernelrl.serve.jobs import ItemSpec, JobStore
from kernelrl.tasks.task import Size, Task

TASK = Task(name="t", source="class Model: pass\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n")


def submit(store: JobStore, *cands: str) -> str:
    return store.submit([ItemSpec(task=TASK, candidate=c) for c in cands], size=Size.SMALL, policy=PolicyName.OPEN,
                        max_pending=100).job_id


def wait_done(store: JobStore, job_id: str, timeout_s: float = 10.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = store.job(job_id)
        if view.state is JobState.DONE:
            return view.results
        time.sleep(0.01)
    raise AssertionError(f"job {job_id} not done")


class Flaky(FakeBackend):
    """Fails its first `failures` batches, and any batch holding a candidate named 'poison'."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.calls = 0

    def evaluate_batch(self, items, *, size=None, policy=None):
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("lane lost")
        if any(c.source == "poison" for _, c in items):
            raise RuntimeError("this program breaks the backend")
        return super().evaluate_batch(items, size=size, policy=policy)


def run(store: JobStore, backend, **kw) -> Dispatcher:
    d = Dispatcher(store, backend, workers=1, idle_poll_s=0.02, retry_pause_s=0.01, **kw)
    d.start()
    return d


def test_backend_failure_is_retried(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    d = run(store, Flaky(failures=2), max_attempts=3)
    try:
        job = submit(store, "a", "b")
        assert [r["message"] for r in wait_done(store, job)] == [fake_result("t", c).message for c in "ab"]
        s = d.stats()
        assert (s.backend_failures, s.job_retries, s.jobs_completed, s.evaluations) == (2, 2, 1, 2)
    finally:
        d.stop()


def test_an_item_that_breaks_the_backend_costs_only_its_own_verdict(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    d = run(store, Flaky(failures=0), max_attempts=2)
    try:
        results = wait_done(store, submit(store, "a", "poison", "b"))
        assert [r["status"] for r in results] == ["correct", Status.TASK_ERROR.value, "correct"]
        assert "this program breaks the backend" in results[1]["message"]
    finally:
        d.stop()


def test_a_job_interrupted_too_often_is_closed(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = JobStore(path)
    job = submit(store, "a")
    for _ in range(3):  # three servers died while judging it
        assert store.claim().job_id == job
        assert store.recover() == 1
    backend = FakeBackend()
    d = run(store, backend, max_attempts=3)
    try:
        (result,) = wait_done(store, job)
        assert result["status"] == Status.TASK_ERROR.value and "interrupted 3 times" in result["message"]
        assert backend.evaluated == []  # not tried a fourth time
    finally:
        d.stop()
