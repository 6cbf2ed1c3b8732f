"""Small guarantees of the server and the run pages, tested from outside: ids out of any range
are 404 (not an OverflowError's 500), and results returned to clients name no server path."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient
from serve_helpers import TINY_CORRECT, FakeBackend

from kernelrl.backends.api import scrub_paths
from kernelrl.web.app import create_app
from watch_fixtures import fill_search_run

HUGE = "99999999999999999999"  # past SQLite's 64-bit integers


def test_watch_ids_out_of_range_are_404(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    ids = fill_search_run(db)
    client = TestClient(create_app(db), raise_server_exceptions=False)
    for path in (f"/runs/{HUGE}", f"/api/runs/{HUGE}", f"/runs/{HUGE}/tasks/a", f"/api/runs/{HUGE}/tasks/a",
                 f"/runs/{ids['run']}/candidates/{HUGE}", f"/runs/-{HUGE}", f"/runs/{ids['run']}/candidates/-1"):
        assert client.get(path).status_code == 404, path


def test_session_turns_out_of_range_are_404(start_server, tiny_task) -> None:
    srv = start_server(FakeBackend())
    created = httpx.post(srv.url + "/v1/sessions", json={"task": tiny_task.source, "name": "t"})
    assert created.status_code == 201
    sid = created.json()["session"]
    for n in (HUGE, "0", "-1", "17"):
        r = httpx.get(f"{srv.url}/v1/sessions/{sid}/turns/{n}")
        assert r.status_code == 404 and "error" in r.json(), (n, r.status_code)


class TracebackBackend(FakeBackend):
    """Results whose errors hold a traceback and compiler output with this machine's paths."""

    def evaluate_batch(self, items: Any, **kw: Any) -> Any:
        here = str(Path(__file__).resolve())
        return [dataclasses.replace(r, message=f"failed in {here}",
                                    errors=[f'Traceback:\n  File "{here}", line 3, in f\n'
                                            f"/usr/include/c++/12/vector:42: error: x in /opt/kernelrl/cache/b/x.cu"])
                for r in super().evaluate_batch(items, **kw)]


def test_results_name_no_server_path(start_server, tiny_task) -> None:
    srv = start_server(TracebackBackend())
    job = httpx.post(srv.url + "/v1/evaluate", json={"items": [{"task": tiny_task.source, "name": "t",
                                                                 "candidate": TINY_CORRECT}]}).json()["job"]
    result = httpx.get(f"{srv.url}/v1/jobs/{job}?wait=10").json()["results"][0]
    text = str(result)
    assert str(Path(__file__).parent) not in text and "/usr/include" not in text and "/opt/kernelrl" not in text
    assert "test_small_guarantees.py" in text and "vector:42" in text and "x.cu" in text  # file names stay


def test_scrub_paths_keeps_what_is_not_a_path() -> None:
    assert scrub_paths({"a": ["ms/call", "1/2", "see /a/b/c.py:3"], "n": 1}) == {"a": ["ms/call", "1/2", "see c.py:3"],
                                                                                  "n": 1}


def test_run_databases_and_exports_are_created_private(tmp_path: Path) -> None:
    import os
    import stat

    from kernelrl.report.export import export_jsonl

    old = os.umask(0o022)  # the usual umask: files would be 0644
    try:
        db = tmp_path / "runs" / "run.db"
        fill_search_run(db)
        out = tmp_path / "rows.jsonl"
        assert export_jsonl(db, out) > 0
    finally:
        os.umask(old)
    for path in (db, out):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for side in (Path(f"{db}-wal"), Path(f"{db}-shm")):
        if side.exists():
            assert stat.S_IMODE(side.stat().st_mode) & 0o077 == 0, side
