"""Collects the verdicts of the red-team and control runs and prints their counts after the run."""

from __future__ import annotations

import pytest

OUTCOMES = pytest.StashKey[dict]()


@pytest.fixture
def outcomes(request) -> dict:
    """suite ("redteam-dynamic", "redteam-policy", "control") -> {fixture: (status, rules, ok)};
    "pending" -> {fixture: the defence it waits for}."""
    store = request.config.stash.get(OUTCOMES, None)
    if store is None:
        store = {}
        request.config.stash[OUTCOMES] = store
    return store


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    store = config.stash.get(OUTCOMES, None)
    if not store:
        return
    tr = terminalreporter
    pending = store.get("pending", {})
    tr.section("red-team and control verdicts")
    for suite in ("redteam-dynamic", "redteam-policy", "control"):
        runs = store.get(suite)
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
