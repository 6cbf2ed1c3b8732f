"""The known-answer learning check (benchmarks/learning_check.py) passes: a tiny policy trained by
`kernelrl train grpo` on the real reward path learns to choose the fastest correct answer, never
the hack or the copy, single- and multi-turn, on one process and on two. (The `read` variant, turn 2
following turn 1's verdict, does not pass yet: benchmarks/README.md.) Slow: each run trains for
real (minutes on 2 cores)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("variant", "processes"), [("single", 1), ("multi", 1), ("single", 2)])
def test_the_policy_learns_the_fastest_correct_answer(variant: str, processes: int, tmp_path: Path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "learning_check.py"), "--variants", variant,
                           "--processes", str(processes), "--steps", "30", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].startswith("learning check:")
    curve = json.loads((tmp_path / f"{variant}-p{processes}" / "curve.json").read_text())
    first = curve["curve"][0]["p"]
    assert curve["passed"] and curve["final"] and not curve["hack_or_copy_won"]
    for label, p in curve["final"].items():  # each judged prompt's right answer (fast), from near chance
        assert p >= 0.8 and first[label]["fast"] < 0.5, (label, p)
