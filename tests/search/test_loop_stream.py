"""A batch's verdicts are stored as each becomes final (the judge's `on_result`), not when the whole
batch returns: a task judged early shows on the progress bar and in the database at once."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from kernelrl.proposers import Proposal
from kernelrl.result import EvalResult, Status
from kernelrl.search.loop import SearchConfig
from kernelrl.tasks.suites import load_tasks
from run_fixtures import searched


class _BothAtOnce:
    """Answers only once both tasks asked, so their candidates share one batch."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=30)

    def propose(self, request) -> Proposal:
        self.barrier.wait()
        code = request.task.source.replace("class Model(", "class ModelNew(") + f"\n# for {request.task.name}\n"
        return Proposal(answer=f"```python\n{code}```", code=code)

    def close(self) -> None:
        pass


class _StreamingJudge:
    """Hands over the first result, and returns the rest only once it is in the database."""

    fingerprint = "streaming-judge"

    def __init__(self, db: Path) -> None:
        self.db = db
        self.batches: list[int] = []
        self.stored_while_running = False

    def profile(self, task):
        return None

    def cached_baseline(self, task):
        return None

    def peaks(self):
        return None

    def _stored(self) -> int:
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True) as conn:
            return int(conn.execute("SELECT count(*) FROM results").fetchone()[0])

    def evaluate_batch(self, items, on_result=None):
        self.batches.append(len(items))
        out = [EvalResult(task=t.name, status=Status.CORRECT, speedup=1.5, speedup_ci=(1.4, 1.6)) for t, _ in items]
        assert on_result is not None
        on_result(0, out[0])
        end = time.monotonic() + 20
        while time.monotonic() < end and not self.stored_while_running:
            self.stored_while_running = self._stored() == 1
            time.sleep(0.05)
        for i in range(1, len(out)):
            on_result(i, out[i])
        return out


def test_a_verdict_is_stored_when_it_is_final_not_when_the_batch_ends(tmp_path: Path, tiny_task) -> None:
    other = tmp_path / "other_task.py"
    other.write_text(tiny_task.source)
    db = tmp_path / "run.db"
    judge = _StreamingJudge(db)
    config = SearchConfig(tasks=(str(tiny_task.path), str(other)), db_path=db, budget=1, chains=1,
                          baselines=False, batch_wait_s=30)
    summary = searched(config, tasks=load_tasks(list(config.tasks)), proposer=_BothAtOnce(), judge=judge)
    assert judge.batches == [2]  # one batch of both tasks' candidates
    assert judge.stored_while_running  # the first verdict was in the database before the batch returned
    assert [t.evaluated for t in summary.tasks] == [1, 1] and summary.evaluations == 2
