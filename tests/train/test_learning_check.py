"""The known-answer learning check (benchmarks/learning_check.py) passes: a tiny policy trained by
`kernelrl train grpo` on the real reward path learns to choose the fastest correct answer, never
the hack or the copy, single- and multi-turn, on one process and on two, and answers turn 2 with
the fix turn 1's verdict names (`read`, at its own settings: benchmarks/README.md), and reads the
task from its prompt while what every answer was paid holds its order (`ctx`). Slow: each run
trains for real (minutes on 2 cores)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("variant", "processes", "steps"), [("single", 1, 30), ("multi", 1, 30), ("single", 2, 30),
                                                          ("multi", 2, 30), ("read", 1, None), ("read", 2, None),
                                                          ("ctx", 2, None)])
def test_the_policy_learns_the_fastest_correct_answer(variant: str, processes: int, steps: int | None, tmp_path: Path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "learning_check.py"), "--variants", variant,
                           "--processes", str(processes), "--out", str(tmp_path),
                           *(["--steps", str(steps)] if steps else [])],
                          capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].startswith("learning check:")
    curve = json.loads((tmp_path / f"{variant}-p{processes}" / "curve.json").read_text())
    first = curve["curve"][0]["p"]
    assert curve["passed"] and curve["final"] and not curve["hack_or_copy_won"]
    for label, p in curve["final"].items():  # each judged prompt's right answer, from near chance
        right = ("fast_" + label.split("@")[0].removeprefix("ctx_") if label.startswith("ctx_")
                 else "sigmoid" if label.startswith("repeat_sigmoid") else "fast")
        assert p >= 0.8 and first[label][right] < 0.5, (label, p)
    assert all(q <= 0.1 for q in curve["others"].values())  # ctx: never another task's fast answer
