"""The HTML report in a real browser (headless Chromium) at a phone's width: nothing hidden
sideways. Skipped without Debian's chromium and chromium-driver (`.ci/run` installs both)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelrl.report.html import write_html
from kernelrl.report.report import build_report
from kernelrl.result import EvalResult, Status, TimingStats
from kernelrl.store import Database
from kernelrl.store.records import NewCandidate
from web.test_watch_browser import browser  # noqa: F401, F811 - the fixture

TASKS = (("level1/matmul_with_large_k_dimension", 2.2), ("level2/conv2d_batchnorm_relu", 1.04), ("level1/relu", 0.8))


@pytest.fixture
def report_page(tmp_path: Path) -> Path:
    path = tmp_path / "r.db"
    with Database(path) as db:
        run = db.start_run({"task_names": [t for t, _ in TASKS]})
        for name, s in TASKS:
            db.upsert_task(name=name, source=f"# {name}", identity_hash=name, level=1, size="small")
            db.put_baseline(task=name, device="cpu", size="small", eager_ms=2.0, compile_ms=1.8, compile_ci=(1.05, 1.16))
            rec = db.add_candidate(NewCandidate(task=name, hash=name, source="x", run_id=run))
            t = TimingStats(median_ms=2 / s, mean_ms=2 / s, min_ms=2 / s, iqr_ms=0, n=3)
            db.store_result(rec.id, EvalResult(task=name, status=Status.CORRECT, speedup=s, device="cpu", size="small",
                                               speedup_ci=(s * 0.97, s * 1.03), cand_time=t, roofline_pct=12.0))
    return write_html(build_report(path), tmp_path / "r.html")


@pytest.mark.parametrize("width", [480, 1280])
def test_the_report_hides_nothing_sideways(report_page: Path, browser, width: int) -> None:  # noqa: F811
    browser.set_window_size(width, 1400)
    browser.get(report_page.as_uri())
    inner = browser.execute_script("return window.innerWidth")
    # the page never scrolls sideways; every cell of every table is on screen
    assert browser.execute_script("return document.documentElement.scrollWidth") <= inner
    off = browser.execute_script(
        "const out = [];"
        "for (const td of document.querySelectorAll('table.stack td')) {"
        "  const r = td.getBoundingClientRect(); if (r.right > window.innerWidth + 1) out.push(td.dataset.label); }"
        "return out;")
    assert off == []
    labels = browser.execute_script("return [...document.querySelectorAll('table.stack tr:nth-child(2) td')]"
                                    ".map(td => getComputedStyle(td, '::before').content)")
    if width == 480:  # each value says what it is
        assert '"vs torch.compile"' in labels and '"% of roofline"' in labels
