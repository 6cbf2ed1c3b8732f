"""Task and candidate pages stay live: while the run writes, a task page opened before new
candidates were judged shows them without anyone reloading it (headless Chromium, as in
test_watch_browser.py, whose server and browser fixtures these tests share)."""

from __future__ import annotations

from test_watch_browser import browser, live  # noqa: F401 - fixtures

from watch_fixtures import RunWriter, wait_for


def _rows(driver) -> int:
    return int(driver.execute_script("return document.querySelectorAll('#candidates tbody tr').length"))


def test_a_task_page_shows_candidates_judged_after_it_was_opened(live, browser) -> None:  # noqa: F811
    base, db, ids = live
    browser.get(f"{base}/runs/{ids['run']}/tasks/b")
    assert wait_for(lambda: _rows(browser) > 0)
    before = _rows(browser)
    browser.execute_script("window.__opened = true")  # gone once the page reloads itself
    writer = RunWriter(db, ids["run"], "b", n=2, every_s=0.3)
    writer.start()
    try:
        assert wait_for(lambda: _rows(browser) == before + 2, 30), _rows(browser)
    finally:
        writer.stop.set()
        writer.join(10)
    assert browser.execute_script("return window.__opened") is None


def test_a_finished_runs_task_page_does_not_poll(live, browser) -> None:  # noqa: F811
    from kernelrl.store import Database
    from kernelrl.store.records import RunStatus

    base, db, ids = live
    with Database(db) as d:
        d.finish_run(ids["run"], RunStatus.FINISHED)
    browser.get(f"{base}/runs/{ids['run']}/tasks/b")
    assert browser.execute_script("return document.querySelectorAll('script').length") == 0


def test_a_candidate_page_shows_its_verdict_once_judged(live, browser) -> None:  # noqa: F811
    from kernelrl.store import Database
    from watch_fixtures import correct

    base, db, ids = live
    browser.get(f"{base}/runs/{ids['run']}/candidates/{ids['pending']}")
    assert wait_for(lambda: "not judged yet" in browser.find_element("css selector", "h3").text, 10)
    assert wait_for(lambda: browser.execute_script("return document.body.dataset.seen"), 20)  # first poll seen
    with Database(db) as d:
        d.store_result(ids["pending"], correct("b", 1.7))
    assert wait_for(lambda: "correct" in browser.find_element("css selector", "h3").text, 30)
    assert browser.execute_script("return document.querySelectorAll('script').length") == 0  # judged: no more polls
