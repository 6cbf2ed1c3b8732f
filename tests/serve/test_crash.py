"""SIGKILL the server mid-run, start it again on the same database: every accepted job is done
exactly once, results of jobs finished before the kill are unchanged and never evaluated again,
and clients that were waiting get their results without noticing more than a delay."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path

from serve_helpers import ServerProcess, fake_result, fast_client, free_port

from kernelrl.tasks.task import Task

TASK = Task(name="plus_one", source="import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                                    "        return x + 1\ndef get_inputs():\n    return [torch.randn(4)]\n"
                                    "def get_init_inputs():\n    return []\n")


def snapshot(db: Path) -> dict[str, tuple[str, list[str | None]]]:
    """job id -> (state, results) as stored (read with a connection of our own)."""
    with sqlite3.connect(db) as conn:
        jobs = conn.execute("SELECT seq, id, state FROM jobs").fetchall()
        out = {}
        for seq, job_id, state in jobs:
            rows = conn.execute("SELECT result FROM items WHERE job_seq = ? ORDER BY idx", (seq,)).fetchall()
            out[job_id] = (state, [r[0] for r in rows])
    return out


def test_sigkill_mid_run_then_restart(tmp_path: Path) -> None:
    port, db, evals = free_port(), tmp_path / "serve.db", tmp_path / "evaluations.log"

    def start() -> ServerProcess:
        return ServerProcess(["tests/serve/serve_helpers.py", "--db", str(db), "--port", str(port), "--delay", "0.04",
                              "--log", str(evals)], port=port, log=tmp_path / "server.out").wait_healthy()

    first = start()
    client = fast_client(first.url, retries=40, backoff_max_s=1.0)
    got: dict[str, str] = {}
    failures: list[BaseException] = []
    lock = threading.Lock()

    def run(c: int) -> None:
        try:
            for b in range(6):
                cands = [f"client {c} batch {b} item {i}" for i in range(3)]
                for cand, res in zip(cands, client.evaluate_batch([(TASK, cand) for cand in cands])):
                    with lock:
                        got[cand] = res.message
        except BaseException as e:  # noqa: BLE001 - any failure fails the test
            failures.append(e)

    threads = [threading.Thread(target=run, args=(c,)) for c in range(8)]
    for t in threads:
        t.start()
    # Kill once some jobs are done and others are still queued or running.
    deadline = time.monotonic() + 60
    while True:
        states = Counter(state for state, _ in snapshot(db).values()) if db.exists() else Counter()
        if states["done"] >= 6 and states["queued"] + states["running"] >= 3:
            break
        assert time.monotonic() < deadline, f"never mid-run: {states}"
        time.sleep(0.02)
    first.kill()
    before = snapshot(db)
    done_before = {j: r for j, (s, r) in before.items() if s == "done"}
    assert done_before and len(done_before) < len(before)
    first_life = [line.split()[1] for line in evals.read_text().splitlines()]

    second = start()
    try:
        for t in threads:
            t.join(120)
        assert not failures, failures
        assert not any(t.is_alive() for t in threads)
        after = snapshot(db)
    finally:
        second.kill()

    # Every client got every result, each the verdict on its own candidate.
    assert len(got) == 8 * 6 * 3
    assert all(msg == fake_result(TASK.name, cand).message for cand, msg in got.items())
    # Every accepted job is done, and jobs done before the kill kept their results.
    assert set(before) <= set(after) and all(state == "done" for state, _ in after.values())
    assert all(after[j][1] == r for j, r in done_before.items())
    # Exactly once: each candidate has one stored result (retried submissions reuse it by key)...
    with sqlite3.connect(db) as conn:
        per_candidate = conn.execute("SELECT candidate, COUNT(*) FROM items WHERE origin_seq IS NULL "
                                     "GROUP BY candidate").fetchall()
    assert len(per_candidate) == 8 * 6 * 3 and {n for _, n in per_candidate} == {1}
    # ...and nothing finished before the kill was evaluated again after it.
    lines = [line.split() for line in evals.read_text().splitlines()]
    second_life = {h for pid, h in lines if int(pid) == second.proc.pid}
    finished_before = {fake_result(TASK.name, c).candidate_hash for c in got
                       if any(fake_result(TASK.name, c).message in (r or "") for rs in done_before.values() for r in rs)}
    assert finished_before and not finished_before & second_life
    assert len(first_life) >= len(finished_before)
    # A job that was running at the kill was queued again by the second server (and finished above).
    if any(state == "running" for state, _ in before.values()):
        assert "queued again" in (tmp_path / "server.out").read_text()
