"""The run page's routes through FastAPI's TestClient: JSON numbers, escaping, headers, errors, mounting."""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from pathlib import Path

import pytest
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.testclient import TestClient

from kernelrl.store.snapshot import snapshot
from kernelrl.web.app import create_app, jsonable, watch_router
from watch_fixtures import EVIL_TASK, HOSTILE, MISMATCH, RunWriter, fill_search_run


@pytest.fixture
def filled(tmp_path: Path) -> tuple[TestClient, Path, dict[str, int]]:
    db = tmp_path / "run.db"
    ids = fill_search_run(db)
    return TestClient(create_app(db)), db, ids


def test_run_json_numbers(filled) -> None:
    client, _, ids = filled
    view = client.get(f"/api/runs/{ids['run']}").json()["view"]
    tasks = {t["task"]: t for t in view["tasks"]}
    assert set(tasks) == {"a", "b", EVIL_TASK}
    a = tasks["a"]
    assert (a["candidates"], a["evaluated"], a["correct"], a["refused"]) == (4, 4, 2, 1)
    assert a["best_candidate"] == ids["fast"] and a["speedup_vs_eager"] == 2.5
    assert a["interval"] == pytest.approx([2.5 * 0.97, 2.5 * 1.03])
    assert a["speedup_vs_compile"] == pytest.approx(2.5 * 5.0 / 10.0) and a["roofline_pct"] == 40.0
    assert tasks["b"]["speedup_vs_compile"] is None  # its baseline has no torch.compile time
    assert dict((p, v) for p, v in view["fast_p"]) == {0.0: 1.0, 1.0: 1.0, 1.5: pytest.approx(1 / 3),
                                                        2.0: pytest.approx(1 / 3)}
    assert view["geomean_vs_eager"] == pytest.approx((2.5 * 1.5 * 1.2) ** (1 / 3))
    prog = view["progress"]
    assert (prog["unit"], prog["done"], prog["total"]) == ("candidates", 7, 12)  # budget 4 x 3 tasks
    assert view["status_counts"] == {"correct": 4, "incorrect": 1, "flagged": 1, "compile_error": 1, "pending": 1}
    assert view["refused_by_rule"] == [["cached_output", 1]]  # a warning is not a refusal
    assert [h["candidate_id"] for h in view["recent_refused"]] == [ids["refused"]]
    # speedup over time: one point per evaluation, each task's best so far
    curve = view["curve"]
    assert len(curve["times"]) == 7 and curve["best"]["a"][:2] == [0.8, 2.5] and curve["best"]["b"][0] is None


def test_task_json_has_every_candidate_with_its_result(filled) -> None:
    client, _, ids = filled
    view = client.get(f"/api/runs/{ids['run']}/tasks/a").json()["view"]
    assert [c["id"] for c in view["candidates"]] == [ids["slow"], ids["fast"], ids["incorrect"], ids["refused"]]
    wrong = next(c for c in view["candidates"] if c["id"] == ids["incorrect"])
    assert wrong["result"]["status"] == "incorrect" and wrong["result"]["errors"] == [MISMATCH]
    assert wrong["parents"] == [ids["fast"]]
    assert [(h["candidate_id"], h["rule"]) for h in view["hack_cases"]] == [(ids["refused"], "cached_output")]


def test_task_page_shows_the_evidence(filled) -> None:
    client, _, ids = filled
    page = client.get(f"/runs/{ids['run']}/tasks/a").text
    wrong = _section(page, ids["incorrect"])
    assert "<dt>first mismatch</dt>" in wrong and MISMATCH in wrong
    fast = _section(page, ids["fast"])
    assert "<dt>timing rounds</dt><dd>rounds 17, calls per sample 4, stopped by ci" in fast
    assert "<dt>% of roofline</dt><dd>40%; reference 16% (memory floor 0.2000 ms" in fast
    assert f"diff against its parent #{ids['slow']}" in fast
    # the parent diff removes the parent's line and adds this one's
    assert "<span class='del'>-        return torch.relu(x)  # slow</span>" in fast
    assert "<span class='add'>+        return torch.relu(x)  # fast</span>" in fast
    assert "<span class='add'>+class ModelNew(torch.nn.Module):</span>" in fast  # against the reference
    refused = _section(page, ids["refused"])
    assert "<td class='rule'>cached_output</td>" in refused
    b = client.get(f"/runs/{ids['run']}/tasks/b").text
    assert "compiler output" in _section(b, ids["compile"]) and "kernel.cpp:3:1: error" in b


def _section(page: str, cid: int) -> str:
    start = page.index(f"<section class='candidate' id='c{cid}'>")
    return page[start:page.index("</section>", start)]


@pytest.mark.parametrize("which", ["index", "run", "task", "candidate", "evil_task"])
def test_hostile_text_is_escaped(filled, which: str) -> None:
    client, _, ids = filled
    url = {"index": "/", "run": f"/runs/{ids['run']}", "task": f"/runs/{ids['run']}/tasks/a",
           "candidate": f"/runs/{ids['run']}/candidates/{ids['refused']}",
           "evil_task": f"/runs/{ids['run']}/tasks/evil/%3Ci%3Ex%3C/i%3E%26%27%22"}[which]
    r = client.get(url)
    assert r.status_code == 200
    page = r.text
    assert "window.__pwned" in page or which in ("index", "evil_task")  # the text is there, as text
    assert "<script>window" not in page and "<img" not in page and "<i>x</i>" not in page
    assert not re.search(r"<[^>]*\sonerror\s*=", page)
    # the only scripts are the package's own files
    assert re.findall(r"<script[^>]*>", page) in ([], ['<script src="/static/uPlot.iife.min.js">',
                                                        '<script src="/static/watch.js">'])


def test_json_carries_hostile_text_as_data(filled) -> None:
    client, _, ids = filled
    r = client.get(f"/api/runs/{ids['run']}")
    assert r.headers["content-type"].startswith("application/json")
    rows = r.json()["display"]["tables"]["refused"]["rows"]
    assert HOSTILE.split("<script>")[0] in json.dumps(rows)
    # every link the script may follow is a path on this site, built from ids
    hrefs = [c["href"] for t in r.json()["display"]["tables"].values() for row in t["rows"] for c in row
             if isinstance(c, dict) and "href" in c]
    assert hrefs and all(h.startswith("/runs/") for h in hrefs)
    assert "/runs/1/tasks/evil/%3Ci%3Ex%3C/i%3E%26%27%22" in hrefs


def test_security_headers_on_every_response(filled) -> None:
    client, _, ids = filled
    for url in ("/", f"/runs/{ids['run']}", f"/api/runs/{ids['run']}", "/runs/99", "/static/watch.js"):
        r = client.get(url)
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp.split(
            "script-src")[1].split(";")[0]
        assert r.headers["x-content-type-options"] == "nosniff"


def test_not_found_and_waiting(tmp_path: Path, filled) -> None:
    client, _, ids = filled
    assert client.get("/runs/99").status_code == 404
    assert client.get("/api/runs/99").json() == {"error": "no run 99 in this database"}
    assert client.get(f"/runs/{ids['run']}/tasks/nope").status_code == 404
    assert client.get(f"/runs/{ids['run']}/candidates/999").status_code == 404
    for name in ("app.py", "..%2Fapp.py", "README.md", "watch.js.map"):
        assert client.get(f"/static/{name}").status_code == 404
    assert client.get("/static/uPlot.iife.min.js").text.startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32)")
    # a database not made yet: the index waits, the run page says so
    empty = TestClient(create_app(tmp_path / "later.db"))
    r = empty.get("/")
    assert r.status_code == 200 and "no database at" in r.text
    assert empty.get("/api/runs").json()["runs"] == []
    assert empty.get("/runs/1").status_code == 503
    assert not (tmp_path / "later.db").exists()  # watching never creates the file


def test_not_a_database_and_newer_schema(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite at all" * 100)
    r = TestClient(create_app(junk)).get("/api/runs")
    assert r.status_code == 503 and "not a usable SQLite database" in r.json()["error"]
    newer = tmp_path / "newer.db"
    fill_search_run(newer)
    with sqlite3.connect(newer) as c:
        c.execute("PRAGMA user_version = 99")  # written by a newer kernelrl
    r = TestClient(create_app(newer)).get("/runs/1")
    assert r.status_code == 503 and "schema version 99" in r.text


def test_snapshot_cannot_write(filled) -> None:
    _, db, _ = filled
    with snapshot(db) as snap, pytest.raises(sqlite3.OperationalError, match="readonly"):
        snap._conn.execute("DELETE FROM candidates")  # no method writes; the connection itself cannot


def test_every_answer_is_consistent_while_a_run_writes(filled) -> None:
    """Polling while another thread commits: each answer is one state of the file."""
    client, db, ids = filled
    writer = RunWriter(db, ids["run"], "b", n=40, every_s=0.005)
    writer.start()
    seen = set()
    try:
        for _ in range(60):
            view = client.get(f"/api/runs/{ids['run']}").json()["view"]
            n = sum(view["status_counts"].values())
            assert n == view["run"]["candidates"] == sum(t["candidates"] for t in view["tasks"])
            assert view["progress"]["done"] == n - view["status_counts"].get("pending", 0)
            seen.add(n)
            if not writer.is_alive():
                break
    finally:
        writer.stop.set()
        writer.join(10)
    assert len(seen) > 1  # it did see the run grow


def test_mounted_under_a_prefix_behind_a_dependency(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    ids = fill_search_run(db)

    def token(request: Request) -> None:
        if request.headers.get("authorization") != "Bearer s3cret":
            raise HTTPException(status_code=401)

    app = FastAPI()
    app.include_router(watch_router(db), prefix="/watch", dependencies=[Depends(token)])
    client = TestClient(app)
    assert client.get(f"/watch/runs/{ids['run']}").status_code == 401
    assert client.get("/watch/static/watch.js").status_code == 401
    auth = {"Authorization": "Bearer s3cret"}
    page = client.get(f"/watch/runs/{ids['run']}", headers=auth).text
    assert 'data-api="/watch/api/runs/1"' in page and 'src="/watch/static/watch.js"' in page
    rows = client.get(f"/watch/api/runs/{ids['run']}", headers=auth).json()["display"]["tables"]["tasks"]["rows"]
    assert rows[0][0] == {"text": "a", "href": "/watch/runs/1/tasks/a"}
    assert client.get("/watch/runs/latest", headers=auth, follow_redirects=False).headers["location"] == "/watch/runs/1"


def test_mounted_under_a_prefix_with_a_path_parameter(tmp_path: Path) -> None:
    """Links, the script's JSON endpoint and redirects keep the prefix's parameter (the reward
    server's `/watch/s/{key}`), beside the same pages mounted without one."""
    db = tmp_path / "run.db"
    ids = fill_search_run(db)
    app = FastAPI()
    app.include_router(watch_router(db), prefix="/plain")
    app.include_router(watch_router(db, sign_out="/logout"), prefix="/s/{key}")
    client = TestClient(app)
    page = client.get(f"/s/k-1_x/runs/{ids['run']}").text
    assert 'data-api="/s/k-1_x/api/runs/1"' in page and 'src="/s/k-1_x/static/watch.js"' in page
    assert "href='/s/k-1_x/logout'" in page and "href='/s/k-1_x/'" in page
    rows = client.get(f"/s/k-1_x/api/runs/{ids['run']}").json()["display"]["tables"]["tasks"]["rows"]
    assert rows[0][0] == {"text": "a", "href": "/s/k-1_x/runs/1/tasks/a"}
    assert client.get("/s/k-1_x/api/runs").json()["display"]["tables"]["runs"]["rows"][0][0]["href"] == \
        "/s/k-1_x/runs/1"
    task = client.get(f"/s/k-1_x/runs/{ids['run']}/tasks/a").text
    assert f"/s/k-1_x/runs/1/candidates/{ids['fast']}" in task and "/plain/" not in task
    assert client.get("/s/k-1_x/runs/latest", follow_redirects=False).headers["location"] == "/s/k-1_x/runs/1"
    assert "'/s/%3Cb%3E/'" in client.get("/s/%3Cb%3E/").text  # a parameter is linked percent-encoded
    plain = client.get(f"/plain/runs/{ids['run']}").text
    assert 'data-api="/plain/api/runs/1"' in plain and "/s/" not in plain and "sign out" not in plain


def test_jsonable_drops_non_finite_numbers() -> None:
    assert jsonable({"a": float("nan"), "b": (1.0, float("inf")), "c": 2}) == {"a": None, "b": [1.0, None], "c": 2}


def test_concurrent_requests_share_nothing(filled) -> None:
    client, _, ids = filled
    errors: list[BaseException] = []

    def hit() -> None:
        try:
            for _ in range(5):
                assert client.get(f"/runs/{ids['run']}/tasks/a").status_code == 200
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=hit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []


def test_a_candidate_without_a_verdict_is_pending_while_its_run_runs_and_not_judged_after(filled) -> None:
    from kernelrl.store import Database
    from kernelrl.store.records import RunStatus

    client, db, ids = filled
    assert client.get(f"/api/runs/{ids['run']}").json()["view"]["status_counts"]["pending"] == 1
    assert "being judged" in client.get(f"/runs/{ids['run']}/tasks/b").text
    with Database(db) as writer:
        writer.finish_run(ids["run"], RunStatus.INTERRUPTED)
    counts = client.get(f"/api/runs/{ids['run']}").json()["view"]["status_counts"]
    assert counts["not judged"] == 1 and "pending" not in counts
    page = client.get(f"/runs/{ids['run']}/tasks/b").text
    assert "not judged: the run ended before it" in page and "--resume" in page
