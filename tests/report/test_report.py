"""Report numbers from a database filled with known verdicts, and the HTML file."""

from __future__ import annotations

import base64
import html
import io
import math
import re
from pathlib import Path

import pytest
from rich.console import Console

from kernelrl.report.console import render_report
from kernelrl.report.html import write_html
from kernelrl.report.metrics import geometric_mean
from kernelrl.report.report import build_report
from kernelrl.result import EvalResult, Finding, Severity, Status, TimingStats
from kernelrl.store import Database, NewCandidate

# task -> verdicts in order: a float is a correct speedup, a Status is a failure, ("flag", rules) is refused
VERDICTS = {
    "a": [0.5, 2.5, ("flag", ["cached_output"])],
    "b": [1.2, Status.INCORRECT],
    "c": [0.8],
    "d": [Status.INCORRECT, Status.COMPILE_ERROR],
    "e": [4.0, 1.6, ("flag", ["extra_stream", "cached_output"])],
}
# task -> (eager_ms, compile_ms); c has none
BASELINES = {"a": (10.0, 5.0), "b": (4.0, 8.0), "e": (3.0, 1.5), "d": (2.0, 1.0)}


def _fill(path: Path, run_id_of=lambda task: None) -> None:
    with Database(path) as db:
        run = db.start_run({"x": 1})
        for task, verdicts in VERDICTS.items():
            db.upsert_task(name=task, source=f"# {task}", identity_hash=task, level=1, size="small")
            for i, v in enumerate(verdicts):
                src = f"{task}{i}"
                rec = db.add_candidate(NewCandidate(task=task, hash=src, source=src, run_id=run))
                if isinstance(v, float):
                    t = TimingStats(median_ms=1 / v, mean_ms=1 / v, min_ms=1 / v, iqr_ms=0, n=3)
                    res = EvalResult(task=task, status=Status.CORRECT, speedup=v, cand_time=t, roofline_pct=10.0 * v)
                elif isinstance(v, Status):
                    res = EvalResult(task=task, status=v)
                else:
                    res = EvalResult(task=task, status=Status.FLAGGED,
                                     findings=[Finding(rule=r, message="m") for r in v[1]]
                                     + [Finding(rule="style_note", message="m", severity=Severity.WARN)])
                db.store_result(rec.id, res)
        db.add_candidate(NewCandidate(task="c", hash="pending", source="p", run_id=run))  # not evaluated
        for task, (eager, comp) in BASELINES.items():
            db.put_baseline(task=task, device="cpu", size="small", eager_ms=eager, compile_ms=comp)


def _one_best_each(path: Path, rows: tuple[tuple[str, float, tuple[float, float]], ...]) -> None:
    """One run; each (task, speedup, 95% interval) row is that task's single correct, timed verdict."""
    with Database(path) as db:
        run = db.start_run({"task_names": [task for task, _, _ in rows]})
        for task, speedup, ci in rows:
            db.upsert_task(name=task, source=f"# {task}", identity_hash=task, level=1, size="small")
            rec = db.add_candidate(NewCandidate(task=task, hash=task, source=task, run_id=run))
            t = TimingStats(median_ms=1 / speedup, mean_ms=1 / speedup, min_ms=1 / speedup, iqr_ms=0, n=3)
            db.store_result(rec.id, EvalResult(task=task, status=Status.CORRECT, speedup=speedup, speedup_ci=ci,
                                               cand_time=t))


def test_numbers(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    _fill(path)
    r = build_report(path)
    assert [t.task for t in r.tasks] == ["a", "b", "c", "d", "e"]
    best = {t.task: t.speedup_vs_eager for t in r.tasks}
    assert best == {"a": 2.5, "b": 1.2, "c": 0.8, "d": None, "e": 4.0}
    # fast_p over all 5 tasks: correct and strictly faster than p
    assert r.fast(0.0) == 4 / 5 and r.fast(1.0) == 3 / 5 and r.fast(1.5) == 2 / 5 and r.fast(2.0) == 2 / 5
    assert r.geomean_vs_eager == pytest.approx((2.5 * 1.2 * 0.8 * 4.0) ** 0.25)
    assert r.median_vs_eager == pytest.approx((1.2 + 2.5) / 2)
    # against compile: speedup x compile_ms / eager_ms; c has no baseline, d no correct candidate
    vs_compile = {t.task: t.speedup_vs_compile for t in r.tasks}
    assert vs_compile["a"] == pytest.approx(1.25) and vs_compile["b"] == pytest.approx(2.4)
    assert vs_compile["e"] == pytest.approx(2.0) and vs_compile["c"] is None and vs_compile["d"] is None
    assert r.geomean_vs_compile == pytest.approx(6.0 ** (1 / 3)) and r.median_vs_compile == pytest.approx(2.0)
    assert (r.solved, r.with_compile) == (4, 3)
    assert (r.candidates, r.evaluated, r.correct) == (12, 11, 6) and r.success_rate == pytest.approx(6 / 11)
    assert dict(r.status_counts) == {"correct": 6, "incorrect": 2, "compile_error": 1, "flagged": 2, "proposed": 1}
    assert r.refused_by_rule == (("cached_output", 2), ("extra_stream", 1))  # warnings are not refusals
    a = next(t for t in r.tasks if t.task == "a")
    assert a.best_so_far == (0.5, 2.5, 2.5) and a.best_candidate is not None
    d = next(t for t in r.tasks if t.task == "d")
    assert d.best_so_far == (None, None)
    assert [(run.status, run.candidates) for run in r.runs] == [("running", 12)]


def test_run_filter_and_empty(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    _fill(path)
    with Database(path) as db:
        run2 = db.start_run({"task_names": ["a", "b"]})  # b got no candidate in this run
        rec = db.add_candidate(NewCandidate(task="a", hash="z", source="z", run_id=run2))
        db.store_result(rec.id, EvalResult(task="a", status=Status.CORRECT, speedup=9.0))
    assert build_report(path).tasks[0].speedup_vs_eager == 9.0
    only2 = build_report(path, run_id=run2)
    assert [t.task for t in only2.tasks] == ["a", "b"] and only2.fast(2.0) == 0.5
    with pytest.raises(ValueError, match="no run 99"):
        build_report(path, run_id=99)
    empty = tmp_path / "empty.db"
    Database(empty).close()
    e = build_report(empty)
    assert e.tasks == () and e.geomean_vs_eager is None and e.success_rate is None
    write_html(e, tmp_path / "empty.html")  # renders without plots


def test_geometric_mean() -> None:
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert geometric_mean([]) is None
    with pytest.raises(ValueError):
        geometric_mean([1.0, 0.0])


def test_console_and_html(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    _fill(path)
    report = build_report(path)
    buf = io.StringIO()
    render_report(report, Console(file=buf, width=140))
    text = buf.getvalue()
    assert "fast_1.5" in text and "40%" in text and "cached_output" in text
    assert f"{math.prod([2.5, 1.2, 0.8, 4.0]) ** 0.25:.2f}x" in text
    out = write_html(report, tmp_path / "r" / "report.html")
    page = out.read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) == 3
    for img in images:
        assert base64.b64decode(img)[:8] == b"\x89PNG\r\n\x1a\n"
    assert "extra_stream" in page and "http" not in page.replace("http-equiv", "")  # self-contained


def test_the_best_candidates_share_of_the_roofline_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    _fill(path)
    by_task = {t.task: t for t in build_report(path).tasks}
    assert by_task["a"].roofline_pct == 25.0 and by_task["e"].roofline_pct == 40.0 and by_task["d"].roofline_pct is None
    buf = io.StringIO()
    render_report(build_report(path), Console(file=buf, width=120))
    assert "roofline" in buf.getvalue() and "40%" in buf.getvalue()
    html = tmp_path / "r.html"
    write_html(build_report(path), html)
    assert "% of roofline" in html.read_text() and "25%" in html.read_text()


def test_a_result_within_noise_says_so_and_shows_the_no_speedup_reward():
    from rich.console import Console

    from kernelrl.report.console import render_result
    from kernelrl.reward import RewardModel

    identical = EvalResult(task="t", status=Status.CORRECT, speedup=1.03, speedup_ci=(0.98, 1.07),
                           noise_band=(0.96, 1.05), message="correct, 1.03x")
    console = Console(record=True, width=200)
    render_result(identical, console)
    text = console.export_text()
    no_speedup = RewardModel().raw(EvalResult(task="t", status=Status.CORRECT, speedup=1.0, speedup_ci=(1.0, 1.0)))
    assert "within noise" in text and "A/A noise band" in text and "0.960-1.050x" in text
    assert no_speedup is not None and f"{no_speedup.raw:+.3f} (paid as 1.0x: within noise)" in text
    faster = EvalResult(task="t", status=Status.CORRECT, speedup=2.0, speedup_ci=(1.9, 2.1), message="correct, 2x")
    console = Console(record=True, width=200)
    render_result(faster, console)
    assert "within noise" not in console.export_text()


def test_faster_has_one_definition_a_speedup_within_noise_never_counts() -> None:
    from kernelrl.report.metrics import counts_as_faster, fast_p, fast_p_at_k

    assert counts_as_faster(1.08, 1.0, within_noise=False)
    assert not counts_as_faster(1.08, 1.0, within_noise=True)  # row_sum 1.08x, interval 0.81-1.26x
    assert not counts_as_faster(1.6, 1.5, within_noise=True)
    assert counts_as_faster(1.08, 0.0, within_noise=True)  # fast_0: solved, noise or not
    assert not counts_as_faster(None, 0.0, within_noise=False) and not counts_as_faster(1.0, 1.0, within_noise=False)
    assert fast_p([1.08, 2.0, None], 1.0, within_noise=[True, False, False]) == pytest.approx(1 / 3)
    assert fast_p([1.08, 2.0, None], 0.0, within_noise=[True, False, False]) == pytest.approx(2 / 3)
    assert fast_p_at_k([1.08, 1.08], 1.0, 1, within_noise=[True, True]) == 0.0
    assert fast_p_at_k([1.08, 1.08], 1.0, 1, within_noise=[False, True]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        fast_p([1.0], 1.0, within_noise=[])


def test_a_best_within_noise_is_not_counted_faster_in_the_terminal_or_the_html(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    _one_best_each(path, (("row_sum", 1.08, (0.81, 1.26)), ("clear", 1.5, (1.4, 1.6))))
    r = build_report(path)
    assert r.fast(1.0) == 0.5 and r.fast(0.0) == 1.0 and (r.faster, r.noisy_above_one) == (1, 1)
    console = Console(record=True, width=160)
    render_report(r, console)
    text = console.export_text()
    assert "1 of 2 tasks (1 more above 1.0x but within noise)" in text and "50%" in text
    page = write_html(r, tmp_path / "r.html").read_text()
    assert "fast_1" in page and ">50%<" in page
    # one noise mark, one legend, in the terminal and the page alike
    from kernelrl.report.metrics import NOISE_LEGEND

    assert "1.08x~" in text and "1.50x~" not in text and re.search(r"<td[^>]*>1.08x~</td>", page) and re.search(r"<td[^>]*>1.50x</td>", page)
    first = NOISE_LEGEND.split(";")[0]
    assert first in " ".join(text.split()) and html.escape(first) in page


def test_only_a_result_slower_beyond_noise_is_red_everywhere(tmp_path: Path) -> None:
    """0.99x within noise is plain; 0.80x beyond noise is red, in the terminal and in the HTML."""
    path = tmp_path / "k.db"
    _one_best_each(path, (("noisy", 0.99, (0.95, 1.03)), ("slow", 0.8, (0.78, 0.82))))
    r = build_report(path)
    page = write_html(r, tmp_path / "r.html").read_text()
    assert re.search(r'<tr><td class="slow"[^>]*>slow</td>', page) and re.search(r"<tr><td data-label[^>]*>noisy</td>", page)
    console = Console(record=True, width=160, color_system="truecolor")
    render_report(r, console)
    lines = console.export_text(styles=True).splitlines()
    slow = next(line for line in lines if "0.80x" in line)
    noisy = next(line for line in lines if "0.99x" in line)
    assert "\x1b[31m" in slow and "\x1b[31m" not in noisy


def test_headlines_carry_their_range_and_counts_and_the_page_fits_a_phone(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    _one_best_each(path, (("row_sum", 1.08, (0.81, 1.26)), ("clear", 1.5, (1.4, 1.6))))
    r = build_report(path)
    assert r.geomean_range_vs_eager == pytest.approx(((0.81 * 1.4) ** 0.5, (1.26 * 1.6) ** 0.5))
    page = write_html(r, tmp_path / "r.html").read_text()
    assert html.escape("1.06-1.42x within the tasks' 95% intervals; over 2 solved tasks") in page
    assert html.escape("geomean of the tasks' best vs eager") in page
    assert "1 of 2 tasks, noise excluded" in page
    assert "<meta name='viewport' content='width=device-width, initial-scale=1'>" in page
    # on a phone every table stacks its rows into labelled lines (a browser test shows it at 480 px)
    assert page.count("<table class='stack'>") == page.count("<table") >= 3
    assert page.count("<td") == page.count("<td data-label=") + page.count("<td class=")


def test_an_empty_run_says_so_where_its_plots_would_be(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    with Database(path) as db:
        db.start_run({"task_names": ["a"]})
    page = write_html(build_report(path), tmp_path / "r.html").read_text()
    assert page.count("Nothing to plot yet: no task has a correct, timed candidate.") == 3
    assert "data:image/png" not in page


def test_the_html_report_is_created_private(tmp_path: Path) -> None:
    import os
    import stat

    path = tmp_path / "k.db"
    _fill(path)
    old = os.umask(0o022)  # the usual umask: files would be 0644
    try:
        out = write_html(build_report(path), tmp_path / "report.html")
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_a_roofline_above_100_percent_is_marked_and_explained_everywhere(tmp_path: Path) -> None:
    from kernelrl.report.console import ROOFLINE_LEGEND, roofline_text

    assert roofline_text(104.2) == "104%*" and roofline_text(100.0) == "100%" and roofline_text(5.25) == "5.2%"
    path = tmp_path / "k.db"
    with Database(path) as db:
        run = db.start_run({"task_names": ["conv"]})
        db.upsert_task(name="conv", source="# conv", identity_hash="conv", level=2, size="small")
        rec = db.add_candidate(NewCandidate(task="conv", hash="c", source="c", run_id=run))
        t = TimingStats(median_ms=1.0, mean_ms=1.0, min_ms=1.0, iqr_ms=0, n=3)
        db.store_result(rec.id, EvalResult(task="conv", status=Status.CORRECT, speedup=1.04, speedup_ci=(1.02, 1.06),
                                           cand_time=t, roofline_pct=104.0))
    r = build_report(path)
    console = Console(record=True, width=200)
    render_report(r, console)
    text = " ".join(console.export_text().split())
    page = write_html(r, tmp_path / "r.html").read_text()
    start = ROOFLINE_LEGEND.split(":")[0]
    assert "104%*" in text and start in text and re.search(r"<td[^>]*>104%\*</td>", page) and html.escape(start) in page
