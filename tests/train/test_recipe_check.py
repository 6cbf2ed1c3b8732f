"""The recipe check (benchmarks/recipe_check.py) runs end to end, shortened: collect, sft, rft and
grpo of `tiny-cpu-learn`, a bench after each stage and one of the test split, in one database,
and prints its stage table, GRPO curve and verdict line in the shape the README shows. A shortened
run says nothing about learning (two GRPO steps); the full run's figures are in
benchmarks/README.md. Slow: it trains and judges for real (minutes on 2 cores)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_the_shortened_recipe_reports_every_stage(tmp_path: Path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "recipe_check.py"), "--short", "--out", str(out)],
                          capture_output=True, text=True, timeout=3000, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    benches = [line.split(" | ")[0].removeprefix("| ") for line in lines
               if line.startswith("| after ")]
    assert benches == ["after SFT", "after RFT", "after GRPO", "after GRPO, test split"]
    stages = [line.split(" | ")[0].removeprefix("| ") for line in lines if line.startswith("| ")
              and line.count("|") == 3 and not line.startswith("| stage |")]
    assert stages[:4] == ["collect", "sft", "bench after SFT", "rft"] and stages[-1] == "total"
    assert any(line.startswith("| 0 | ") for line in lines)  # the GRPO curve's first step
    assert lines[-1].startswith("fast_1 after SFT ") and lines[-1].endswith(("PASS", "FAIL"))
    assert (out / "code.db").is_file() and (out / "recipe_check.md").read_text().strip().endswith(lines[-1])
