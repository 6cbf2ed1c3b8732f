"""The run pages' code and diffs at a bounded cost (`kernelrl.web.code`): the issue's
page (100 chained 5,000-line candidates, over 580 s before) answers in seconds, each diff is
computed once, a page stops when its client leaves, and hidden bidirectional controls are shown."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kernelrl.store import Database, NewCandidate
from kernelrl.web import code
from kernelrl.web.app import create_app, rendered
from kernelrl.web.code import MAX_DIFF_LINES, PageBudget, diff_html, visible
from watch_fixtures import REFERENCE, correct, start_run

TROJAN = "access = 'user' # \u202e } if is_admin: \u2066 # \u2069\n"


def _big(i: int, lines: int) -> str:
    # every candidate shifts the lines of its parent: the kind of input difflib is slowest on
    body = "".join(f"    x{(j + i) if j % 2 else j} = {j}\n" for j in range(lines))
    return f"import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n{body}        return x\n"


def _chain(path: Path, n: int, lines: int) -> int:
    with Database(path) as db:
        run = start_run(db, ["t"])
        parent: tuple[int, ...] = ()
        for i in range(n):
            source = _big(i, lines)
            rec = db.add_candidate(NewCandidate(task="t", hash=f"h{i}", source=source, parents=parent, step=i,
                                                run_id=run, proposer="p", answer=source))
            db.store_result(rec.id, correct("t", 1.0))
            parent = (rec.id,)
    return run


def test_the_issues_task_page_answers_in_seconds(tmp_path: Path) -> None:
    run = _chain(tmp_path / "run.db", 100, 5000)  # 100 chained 5,000-line candidates
    client = TestClient(create_app(tmp_path / "run.db"))
    t0 = time.monotonic()
    r = client.get(f"/runs/{run}/tasks/t")
    first = time.monotonic() - t0
    assert r.status_code == 200 and "not diffed here" in r.text
    assert first < 30, first
    # a side under the cap is diffed, and each diff is computed once: a reload costs far less
    run2 = _chain(tmp_path / "small.db", 40, MAX_DIFF_LINES // 2 - 20)
    small = TestClient(create_app(tmp_path / "small.db"))
    t0 = time.monotonic()
    assert "class='diff'" in small.get(f"/runs/{run2}/tasks/t").text
    cold = time.monotonic() - t0
    t0 = time.monotonic()
    small.get(f"/runs/{run2}/tasks/t")
    warm = time.monotonic() - t0
    assert warm < cold / 2, (cold, warm)


def test_each_diff_is_computed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = code.difflib.unified_diff

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(code.difflib, "unified_diff", counting)
    a, b = f"a\nb\n{time.time()}\n", "a\nc\n"
    first = diff_html(a, b, "x", "y")
    assert diff_html(a, b, "x", "y") == first and len(calls) == 1


def test_a_spent_or_cancelled_budget_stops_diffing() -> None:
    budget = PageBudget(60)
    budget.cancel.set()
    assert "ran out" in diff_html(f"{time.time()}\n", "b\n", "x", "y", budget)
    assert "ran out" in diff_html(f"{time.time()}\n", "b\n", "x", "y", PageBudget(0))


def test_a_page_stops_when_its_client_leaves() -> None:
    stopped = []

    def build(budget: PageBudget) -> str:
        while not budget.spent():
            time.sleep(0.01)
        stopped.append(budget.cancel.is_set())
        return "done"

    class Gone:
        async def is_disconnected(self) -> bool:
            return True

    t0 = time.monotonic()
    assert asyncio.run(rendered(Gone(), build, budget_s=30)) == "done"  # type: ignore[arg-type]
    assert stopped == [True] and time.monotonic() - t0 < 5


def test_hidden_controls_are_shown(tmp_path: Path) -> None:
    assert visible(TROJAN) == "access = 'user' # [U+202E] } if is_admin: [U+2066] # [U+2069]\n"
    with Database(tmp_path / "run.db") as db:
        run = start_run(db, ["t"])
        source = REFERENCE.replace("Model", "ModelNew") + TROJAN
        rec = db.add_candidate(NewCandidate(task="t", hash="h", source=source, parents=(), step=0, run_id=run,
                                            proposer="p", answer=source))
        db.store_result(rec.id, correct("t", 1.0))
    client = TestClient(create_app(tmp_path / "run.db"))
    for path in (f"/runs/{run}/tasks/t", f"/runs/{run}/candidates/{rec.id}"):
        text = client.get(path).text
        assert "[U+202E]" in text and not any(chr(c) in text for c in code.HIDDEN), path
