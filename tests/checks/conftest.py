"""The `outcomes` fixture: where the red-team and control tests record their verdicts, printed
after the run (`tests/verdict_summary.py`)."""

from __future__ import annotations

import pytest

import verdict_summary


@pytest.fixture
def outcomes(request) -> dict:
    """suite ("redteam-dynamic", "redteam-policy", "control") -> {fixture: (status, rules, ok)};
    "pending" -> {fixture: the defence it waits for}."""
    return verdict_summary.store(request.config)
