"""`bidi_control` (kernelrl/checks/static/text.py): Trojan Source is refused wherever it hides."""

from __future__ import annotations

import pytest

from kernelrl.checks import rules as R
from kernelrl.checks.policy import get_policy
from kernelrl.checks.static import check_source
from kernelrl.result import Severity

HEAD = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"


@pytest.mark.parametrize("line", [
    "        # \u202e } \u2066if fast:\u2069 \u2066 # reads as a comment, is not\n",
    "        name = 'user\u202e \u2066# admin\u2069 \u2066'\n",
    "        cpp = '/* \u2067 */ return 0;'\n",
    "        s = '\u200f'\n",
    "        s = '\u061c'\n",
])
def test_bidi_controls_are_refused(line: str) -> None:
    found = [f for f in check_source(HEAD + line + "        return x\n") if f.rule == R.BIDI_CONTROL]
    assert len(found) == 1 and found[0].line == 6 and "U+" in found[0].message
    for policy in ("open", "strict"):
        assert get_policy(policy).severity(R.BIDI_CONTROL) is Severity.REJECT


def test_text_in_other_scripts_is_not_a_control() -> None:
    source = HEAD + "        label = 'שלום مرحبا Привет'  # right-to-left letters, no control\n        return x\n"
    assert not [f for f in check_source(source) if f.rule == R.BIDI_CONTROL]


def test_many_lines_are_reported_a_few_times() -> None:
    source = HEAD + "        # \u202e\n" * 1000 + "        return x\n"
    assert len([f for f in check_source(source) if f.rule == R.BIDI_CONTROL]) == 5


def test_checks_past_their_deadline_are_a_rejecting_finding() -> None:
    source = HEAD + "        return x\n"
    assert not [f for f in check_source(source) if f.rule == R.SYNTAX_ERROR]
    late = [f for f in check_source(source, deadline_s=0.0) if f.rule == R.SYNTAX_ERROR]
    assert len(late) == 1 and "deadline" in late[0].message and late[0].severity is Severity.REJECT
    assert get_policy("open").severity(R.SYNTAX_ERROR) is Severity.REJECT
