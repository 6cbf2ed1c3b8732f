"""The red-team and control verdicts of a run, counted and printed after it (`tests/conftest.py`
registers the hooks; `checks/conftest.py`'s `outcomes` fixture records into `store`).

Under pytest-xdist each worker process records its own; each sends them to the controller as it
ends (`workeroutput`), which merges them before printing, so one summary covers the whole run.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

OUTCOMES = pytest.StashKey[dict]()
_WORKER_KEY = "kernelrl_verdict_outcomes"


def store(config: pytest.Config) -> dict[str, dict[str, Any]]:
    """suite ("redteam-dynamic", "redteam-policy", "control") -> {fixture: (status, rules, ok)};
    "pending" -> {fixture: the defence it waits for}."""
    got = config.stash.get(OUTCOMES, None)
    if got is None:
        got = {}
        config.stash[OUTCOMES] = got
    return got


def send_from_worker(config: pytest.Config) -> None:
    """In an xdist worker, hand what it recorded to the controller."""
    out = getattr(config, "workeroutput", None)
    if out is not None:
        out[_WORKER_KEY] = json.dumps(config.stash.get(OUTCOMES, {}))


def merge_from_worker(config: pytest.Config, worker_output: dict[str, Any]) -> None:
    """In the controller, take a finished worker's verdicts."""
    mine = store(config)
    for suite, runs in json.loads(worker_output.get(_WORKER_KEY, "{}")).items():
        for name, value in runs.items():
            mine.setdefault(suite, {})[name] = tuple(value) if isinstance(value, list) else value


def write(tr: Any, config: pytest.Config) -> None:
    got = config.stash.get(OUTCOMES, None)
    if not got:
        return
    pending = got.get("pending", {})
    tr.section("red-team and control verdicts")
    for suite in ("redteam-dynamic", "redteam-policy", "control"):
        runs = got.get(suite)
        if not runs:
            continue
        statuses: dict[str, int] = {}
        for status, _, _ in runs.values():
            statuses[status] = statuses.get(status, 0) + 1
        ok = sum(1 for _, _, good in runs.values() if good)
        summary = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
        if suite == "control":
            tr.write_line(f"controls: {statuses.get('correct', 0)}/{len(runs)} accepted ({summary})")
        else:
            refused = sum(v for k, v in statuses.items() if k != "correct")
            tr.write_line(f"{suite}: {ok}/{len(runs)} got their expected verdict; "
                          f"{refused} refused ({summary})")
        for name, (status, rules, good) in sorted(runs.items()):
            label = "ok " if good else ("PENDING" if suite == "redteam-dynamic" and name in pending else "BAD")
            tr.write_line(f"  {label} {name}: {status} {', '.join(rules)}")
        if suite == "redteam-dynamic" and pending:
            tr.write_line(f"  pending defences ({len(pending)}): " + "; ".join(
                f"{name}: {why}" for name, why in sorted(pending.items())))
