"""A pytest plugin for `gpu_check.sh`: one JSON line per test, appended as each test ends.

Loaded with `-p gpu_check_plugin` (benchmarks/ on PYTHONPATH). Writes to the file named by
`GPU_CHECK_TESTS` (nothing without it): `{"step", "nodeid", "outcome", "seconds", "message"}`,
where outcome is passed, failed, error (setup or teardown failed), skipped, xfailed, xpassed or
collection_error, and message is the end of the failure's report (2000 characters) or the skip
reason. Each line is flushed and synced before the next test starts, so a run cut by its time
limit keeps every test that ended; a test cut in the middle has no line. Under pytest-xdist
(`-n`) the controller writes each line once; its workers, which see the same reports, write none.
A worker is told by its own config (`workerinput`, xdist's mark), not by the environment: a pytest
started inside an xdist worker (this plugin's own tests under `pytest -n`) inherits the worker's
`PYTEST_XDIST_WORKER` and is still a controller.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

_open: dict[str, dict[str, Any]] = {}
_worker = False  # set by pytest_configure: this process is an xdist worker


def pytest_configure(config: pytest.Config) -> None:
    global _worker
    _worker = hasattr(config, "workerinput")


def _write(row: dict[str, Any]) -> None:
    path = os.environ.get("GPU_CHECK_TESTS")
    if not path or _worker:
        return
    row = {"step": os.environ.get("GPU_CHECK_STEP", ""), **row}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _message(report: Any) -> str:
    if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        return str(report.longrepr[2])
    return str(report.longrepr or "")[-2000:]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    row = _open.setdefault(report.nodeid, {"nodeid": report.nodeid, "outcome": "passed", "seconds": 0.0,
                                           "message": ""})
    row["seconds"] = round(row["seconds"] + report.duration, 3)
    xfail = hasattr(report, "wasxfail")
    if report.failed and row["outcome"] in ("passed", "skipped", "xfailed"):
        row["outcome"] = "failed" if report.when == "call" else "error"
        row["message"] = _message(report)
    elif report.skipped and row["outcome"] == "passed":
        row["outcome"] = "xfailed" if xfail else "skipped"
        row["message"] = str(getattr(report, "wasxfail", "")) or _message(report)
    elif report.passed and xfail and report.when == "call":
        row["outcome"] = "xpassed"
    if report.when == "teardown":
        _write(_open.pop(report.nodeid))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _write({"nodeid": report.nodeid, "outcome": "collection_error", "seconds": 0.0,
                "message": str(report.longrepr or "")[-2000:]})
