"""SIGKILL the server in the middle of a session, start it again on the same database: the turns
already judged keep their verdicts and rewards and are never judged again, the turn being judged
at the kill is judged after the restart, and a turn stored just before a job could be stored for
it is submitted again under its key, not lost."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx
from serve_helpers import ServerProcess, fake_result, free_port

from kernelrl.serve.session_store import SessionStore

TASK_SOURCE = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n"
               "def get_inputs():\n    return [torch.randn(4)]\ndef get_init_inputs():\n    return []\n")
CODES = [f"import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x + 1  # v{i}\n"
         for i in range(1, 4)]


def job_state(db: Path, job: str) -> str | None:
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT state FROM jobs WHERE id = ?", (job,)).fetchone()
    return row[0] if row else None


def test_sigkill_mid_session_then_restart(tmp_path: Path) -> None:
    port, db, evals = free_port(), tmp_path / "serve.db", tmp_path / "evaluations.log"

    def start() -> ServerProcess:
        return ServerProcess(["tests/serve/serve_helpers.py", "--db", str(db), "--port", str(port), "--delay", "1.0",
                              "--log", str(evals)], port=port, log=tmp_path / "server.out").wait_healthy()

    first = start()
    url = first.url
    created = httpx.post(f"{url}/v1/sessions", json={"task": TASK_SOURCE, "turns": 3})
    assert created.status_code == 201, created.text
    session = created.json()["session"]
    turns = f"{url}/v1/sessions/{session}/turns"
    one = httpx.post(turns, params={"wait": 20}, json={"candidate": CODES[0], "turn": 1}, timeout=30).json()
    assert one["state"] == "judged" and one["verdict"].startswith("Correct.")
    two = httpx.post(turns, params={"wait": 0}, json={"candidate": CODES[1], "turn": 2}, timeout=30).json()
    assert two["state"] == "pending"
    deadline = time.monotonic() + 20
    while job_state(db, two["job"]) != "running":  # killed while turn 2 is being judged
        assert time.monotonic() < deadline
        time.sleep(0.02)
    first.kill()

    second = start()
    try:
        after = httpx.get(f"{url}/v1/sessions/{session}/turns/2", params={"wait": 20}, timeout=30).json()
        assert after["state"] == "judged" and after["verdict"].startswith("Correct.")
        assert fake_result("x", CODES[1]).message.split()[-1] in httpx.get(f"{url}/v1/jobs/{two['job']}").text
        view = httpx.get(f"{url}/v1/sessions/{session}").json()
        assert view["history"][0] == {**one, "prompt": None}  # turn 1 as it was (the next prompt is turn 3's now)
        assert view["rewards"][0] == one["reward"] and view["next_turn"] == 3
    finally:
        second.kill()

    # Turn 3 stored, then the server died before a job was stored for it: the next read submits it.
    store = SessionStore(db)
    record = store.get(session, owner="")
    assert record is not None
    store.add_turn(record.seq, 3, answer=None, code=CODES[2], key=f"crash-test/{session}/3")
    store.close()
    third = start()
    try:
        last = httpx.get(f"{url}/v1/sessions/{session}/turns/3", params={"wait": 20}, timeout=30).json()
        if last["state"] == "pending":  # the first read submitted it; this one waits for its verdict
            last = httpx.get(f"{url}/v1/sessions/{session}/turns/3", params={"wait": 20}, timeout=30).json()
        assert last["state"] == "judged" and last["done"]
        assert len(httpx.get(f"{url}/v1/sessions/{session}").json()["returns"]) == 3
    finally:
        third.kill()

    lines = [line.split() for line in evals.read_text().splitlines()]
    by_hash: dict[str, list[int]] = {}
    for pid, h in lines:
        by_hash.setdefault(h, []).append(int(pid))
    hashes = [fake_result("x", c).candidate_hash for c in CODES]
    assert by_hash[hashes[0]] == [first.proc.pid]  # judged once, before the kill, never again
    assert second.proc.pid in by_hash[hashes[1]]  # the turn cut short was judged after the restart
    assert by_hash[hashes[2]] == [third.proc.pid]
