"""The run page in a real browser: headless Chromium (Debian's) driven by selenium.

The page of a run that a thread keeps writing updates without a reload; its task page shows the
refused candidate with its rule and the first mismatch of the incorrect one; hostile text from
candidates stays text (no script of theirs runs); the browser logs no script or policy error.
The pages are served as `kernelrl watch` serves them (behind the request guard and the HTTP
limits), so these tests also show the guard lets a real browser's own requests through. Signing
in to `kernelrl serve --watch-db` works from the browser (its form post names its origin) and
leads to the session's own path, whose pages link and poll under it; a program on another port of
127.0.0.1 never receives the session cookie unless the browser is sent to that very path there;
a page of another site rebound to 127.0.0.1 (Chromium's host resolver rules stand in for DNS
rebinding) reads nothing. The screenshot test (slow) writes the run and task pages as PNGs, at 1280 px and at a phone's
480 px (where the page must not scroll sideways), to $KERNELRL_SCREENSHOTS or the test's temp
folder.

Skipped when /usr/bin/chromium or /usr/bin/chromedriver is missing (`.ci/run` installs both).
"""

from __future__ import annotations

import http.server
import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import uvicorn

from kernelrl.web.app import bind
from kernelrl.web.http import HttpLimits, uvicorn_config
from kernelrl.web.live import standalone_app
from watch_fixtures import EVIL_TASK, HOSTILE, MISMATCH, RunWriter, fill_search_run, wait_for

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
NO_BROWSER = not (Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file())
NEEDS = "needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)"
pytestmark = pytest.mark.skipif(NO_BROWSER, reason=NEEDS)
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[str, Path, dict[str, int]]]:
    """A database with one search run, served on a free loopback port: (base URL, db, ids)."""
    db = tmp_path / "run.db"
    ids = fill_search_run(db)
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn_config(standalone_app(db, host="127.0.0.1"), HttpLimits()))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    assert wait_for(lambda: server.started, 20)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", db, ids
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


REBOUND = "rebound.example"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    # here too, not only in this module's mark: other modules import this fixture
    if NO_BROWSER:
        pytest.skip(NEEDS)
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tmp_path / "chromium-profile"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--window-size=1280,1400",
                f"--user-data-dir={profile}", f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _cell(driver, table: str, task: str, column: int) -> str:
    """One cell of a table's row, read in one script call (the page may rebuild the table between calls)."""
    return driver.execute_script(
        "for (const tr of document.querySelectorAll('#' + arguments[0] + ' tbody tr')) {"
        "  if (tr.cells[0].textContent === arguments[1]) return tr.cells[arguments[2]].textContent; }"
        "return '';", table, task, column)


def _open_run(driver, url: str) -> None:
    """Load a run page and wait for its first refresh (after it, unchanged tables are left alone)."""
    driver.get(url)
    assert wait_for(lambda: driver.execute_script("return document.body.dataset.updates") is not None)


def _errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_run_page_updates_while_the_run_is_written(live, browser) -> None:
    base, db, ids = live
    _open_run(browser, f"{base}/runs/{ids['run']}")
    browser.execute_script("window.__sameDocument = true")  # gone if the page reloads
    before = int(_cell(browser, "tasks", "b", 2))
    writer = RunWriter(db, ids["run"], "b", n=4, every_s=0.3)
    writer.start()
    try:
        assert wait_for(lambda: _cell(browser, "tasks", "b", 2) == str(before + 4), 30), _cell(browser, "tasks", "b", 2)
    finally:
        writer.stop.set()
        writer.join(10)
    assert browser.execute_script("return window.__sameDocument") is True
    assert _cell(browser, "tasks", "b", 5) == "3.00x"  # the live writer's best: 1 + 0.5 * 4
    assert browser.find_element(By.ID, "progress").text.startswith(f"{8 + 4 - 1}/12 ")  # pending one not counted
    # the speedup chart was drawn by the vendored uPlot, served from the package
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-speedup .uplot")
    # the script rebuilt the refused table from JSON: the hostile message is text in it, no element
    assert "<script>window.__pwned = 1</script>" in browser.find_element(By.ID, "refused").text
    assert browser.execute_script("return document.querySelectorAll('img, iframe, script:not([src])').length") == 0
    assert browser.execute_script("return window.__pwned") is None
    assert _errors(browser) == []
    # every refresh was rendered whole: a table or text the script could not fill says so in "updated"
    assert "no answer" not in browser.find_element(By.ID, "updated").text
    assert browser.find_element(By.ID, "judge_rate").text.endswith("timing groups")


def test_task_page_shows_rule_and_first_mismatch(live, browser) -> None:
    base, _, ids = live
    _open_run(browser, f"{base}/runs/{ids['run']}")
    browser.find_element(By.LINK_TEXT, "a").click()
    assert wait_for(lambda: browser.find_elements(By.ID, "hacks"))
    hacks = browser.find_element(By.ID, "hacks").text
    assert "cached_output" in hacks and f"#{ids['refused']}" in hacks
    section = browser.find_element(By.ID, f"c{ids['incorrect']}")
    assert "first mismatch" in section.text and MISMATCH in section.text
    refused = browser.find_element(By.ID, f"c{ids['refused']}")
    assert "cached_output" in refused.text
    # hostile source and messages are shown as text, and none of their markup became elements
    browser.find_element(By.CSS_SELECTOR, f"#c{ids['refused']} details:has(> pre.code) > summary").click()
    assert "window.__pwned = 1" in refused.find_element(By.CSS_SELECTOR, "pre.code").text
    assert browser.execute_script("return window.__pwned") is None
    # (the page's own scripts, from this site, keep it live while the run goes)
    assert browser.execute_script("return document.querySelectorAll('img, iframe, script:not([src$=\"/static/watch.js\"])"
                                  ":not([src$=\"/static/uPlot.iife.min.js\"])').length") == 0
    assert _errors(browser) == []


def test_hostile_task_name_links_to_its_own_page(live, browser) -> None:
    base, _, ids = live
    _open_run(browser, f"{base}/runs/{ids['run']}")
    browser.find_element(By.LINK_TEXT, EVIL_TASK).click()
    assert wait_for(lambda: browser.find_elements(By.TAG_NAME, "h1"))
    assert browser.find_element(By.TAG_NAME, "h1").text == EVIL_TASK
    assert browser.execute_script("return window.__pwned") is None


@pytest.mark.slow
def test_screenshots(live, browser, tmp_path: Path) -> None:
    base, db, ids = live
    out = Path(os.environ.get("KERNELRL_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    writer = RunWriter(db, ids["run"], "b", n=3, every_s=0.1)
    writer.start()
    writer.join(10)
    browser.get(f"{base}/runs/{ids['run']}")
    assert wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#chart-speedup .uplot"))
    shots = {"run": out / "watch-run.png"}
    browser.save_screenshot(str(shots["run"]))
    browser.get(f"{base}/runs/{ids['run']}/tasks/a")
    for summary in browser.find_elements(By.CSS_SELECTOR, f"#c{ids['fast']} details:not([open]) > summary"):
        summary.click()
    browser.execute_script("arguments[0].scrollIntoView()", browser.find_element(By.ID, f"c{ids['fast']}"))
    shots["task"] = out / "watch-task.png"
    browser.save_screenshot(str(shots["task"]))
    # At phone width nothing makes the page itself scroll sideways: wide tables scroll in place.
    browser.set_window_size(480, 900)
    for name, path in (("run-phone", f"/runs/{ids['run']}"), ("task-phone", f"/runs/{ids['run']}/tasks/a")):
        browser.get(base + path)
        if name == "run-phone":
            assert wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#chart-speedup .uplot"))
        wide = browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
        assert wide <= 0, f"{name}: the page is {wide} px wider than a 480 px window"
        shots[name] = out / f"watch-{name}.png"
        browser.save_screenshot(str(shots[name]))
    for path in shots.values():
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, (path, len(data))
    assert HOSTILE not in browser.page_source  # the raw markup never reaches the document
    assert _errors(browser) == []


def test_a_rebound_host_name_reads_nothing(live, browser) -> None:
    """A page of another site whose name now resolves to 127.0.0.1 (DNS rebinding) is the
    pages' origin to the browser; `kernelrl watch` refuses its Host, so nothing of the run shows."""
    base, _, ids = live
    port = base.rsplit(":", 1)[1]
    for path in ("/", f"/runs/{ids['run']}", "/api/runs"):
        browser.get(f"http://{REBOUND}:{port}{path}")
        text = browser.find_element(By.TAG_NAME, "body").text
        assert "is not served here" in text and "tasks" not in text, text[:200]
    browser.get(f"{base}/api/runs")  # the same pages by their own name answer
    assert '"runs"' in browser.find_element(By.TAG_NAME, "body").text


@pytest.fixture
def reward_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """`kernelrl serve --watch-db` with a token file, on a free loopback port: (URL, token)."""
    from kernelrl.serve.config import ServeConfig
    from kernelrl.serve.server import RewardServer
    from serve.serve_helpers import TOKEN, FakeBackend, write_token_file

    db = tmp_path / "run.db"
    fill_search_run(db)
    config = ServeConfig(port=0, db_path=tmp_path / "serve.db", watch_db=db,
                         token_file=write_token_file(tmp_path / "token.txt"))
    server = RewardServer(config, backend=FakeBackend()).start_in_thread()
    try:
        yield server.url, TOKEN
    finally:
        server.stop()


def _sign_in(browser, url: str, token: str) -> str:
    """Sign in through the form as a person does; the session's pages' path (/watch/s/KEY)."""
    browser.get(f"{url}/watch/login")
    browser.find_element(By.NAME, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    assert wait_for(lambda: "/login" not in browser.current_url), browser.current_url
    return urlsplit(browser.current_url).path.rstrip("/")


def test_a_browser_signs_in_and_out(reward_server, browser) -> None:
    url, token = reward_server
    name = f"kernelrl_watch_{url.rsplit(':', 1)[1]}"
    browser.get(f"{url}/watch/")
    assert wait_for(lambda: "/watch/login" in browser.current_url)  # no session: the sign-in form
    browser.find_element(By.NAME, "token").send_keys("not-the-token-" + "x" * 30)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    assert wait_for(lambda: "failed=1" in browser.current_url)
    base = _sign_in(browser, url, token)
    assert re.fullmatch(r"/watch/s/[A-Za-z0-9_-]{43}", base), base
    assert wait_for(lambda: browser.find_elements(By.TAG_NAME, "h1"))
    assert "forbidden" not in browser.page_source and "not served" not in browser.page_source
    cookie = browser.get_cookie(name)
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == base
    # the pages' links and their script's polling stay under the session's path
    assert wait_for(lambda: _clicked(browser, "#runs tbody a"))  # the table is redrawn as it polls
    assert wait_for(lambda: urlsplit(browser.current_url).path.startswith(base + "/runs/"))
    assert wait_for(lambda: browser.execute_script("return document.body.dataset.updates") is not None)
    assert _errors(browser) == []
    browser.get(f"{url}{base}/api/runs")
    assert '"runs"' in browser.find_element(By.TAG_NAME, "body").text
    browser.get(f"{url}/watch/api/runs")  # the cookie is not sent outside its path, and alone is no session
    assert wait_for(lambda: "/watch/login" in browser.current_url)
    browser.get(f"{url}{base}/")
    browser.find_element(By.LINK_TEXT, "sign out").click()
    assert "This browser's session ends" in browser.page_source  # the sign-out page says what it does
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    assert wait_for(lambda: "/watch/login" in browser.current_url)
    assert "You are signed out" in browser.page_source
    browser.get(f"{url}{base}/api/runs")
    assert wait_for(lambda: "/watch/login" in browser.current_url)  # ended
    assert browser.get_cookie(name) is None  # and the browser dropped the cookie at its path


def _clicked(browser, css: str) -> bool:
    """Click the element `css` finds; False when it is not there yet or was redrawn meanwhile."""
    try:
        browser.find_element(By.CSS_SELECTOR, css).click()
    except (NoSuchElementException, StaleElementReferenceException):
        return False
    return True


class _Listener(http.server.ThreadingHTTPServer):
    """Another program on another loopback port: records the Cookie header of every request."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        listener = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                listener.seen.append((self.path, self.headers.get("Cookie", "")))
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def test_another_port_of_the_host_gets_no_session(reward_server, browser) -> None:
    """Browsers send a host's cookies to every port of it; the session's cookie goes only under
    its path, which holds the key, so a program on another port sees it only if the browser is
    sent to that key's path there (and the key alone is not a session either)."""
    url, token = reward_server
    other = _Listener()
    thread = threading.Thread(target=other.serve_forever, daemon=True)
    thread.start()
    try:
        base = _sign_in(browser, url, token)
        value = browser.get_cookie(f"kernelrl_watch_{url.rsplit(':', 1)[1]}")["value"]
        there = f"http://127.0.0.1:{other.server_address[1]}"
        for path in ("/", "/watch", "/watch/", "/watch/api/runs", "/watch/login", "/watch/s/",
                     "/watch/s/" + "A" * 43 + "/", base + "x/"):
            browser.get(there + path)
        assert len(other.seen) >= 8 and all(value not in cookies for _, cookies in other.seen), other.seen
        browser.get(there + base + "/")  # the one way: the key's own path (what the key keeps secret)
        # (the page's own request, not the favicon's the browser may send after it)
        assert wait_for(lambda: any(value in cookies for path, cookies in other.seen if path == base + "/")), other.seen
    finally:
        other.shutdown()
        other.server_close()
        thread.join(10)


def test_an_open_run_page_shows_its_run_finished_then_says_how_to_keep_watching(tmp_path: Path, browser) -> None:
    """The page of a run (`--watch.port`) is served a little past the run's end, so a page open in
    the browser shows the run finished (not "running" frozen); when its server is gone the page
    says so, and names `kernelrl watch --db` with the run's database."""
    from kernelrl.store import Database
    from kernelrl.store.records import RunStatus
    from kernelrl.web.live import LivePage

    db = tmp_path / "run.db"
    ids = fill_search_run(db)
    page = LivePage(db, linger_s=4.0).start()
    try:
        _open_run(browser, f"{page.url}runs/{ids['run']}")
        assert "running" in browser.find_element(By.ID, "status").text
        with Database(db) as writer:
            writer.finish_run(ids["run"], RunStatus.FINISHED)
    finally:
        page.close()  # the run's block ends
    assert wait_for(lambda: "finished" in browser.find_element(By.ID, "status").text, 15)
    assert wait_for(lambda: browser.execute_script("return !!document.getElementById('gone')"), 30)
    note = browser.find_element(By.ID, "gone").text
    assert "server has stopped" in note and f"kernelrl watch --db {db}" in note
    assert "finished" in browser.find_element(By.ID, "status").text  # the last state it was sent stays


def test_a_run_page_opened_before_its_run_starts_waits_for_it(live, browser) -> None:
    """`/runs/N` for a run not stored yet (opened in the run's first second) reloads until it is."""
    from kernelrl.store import Database

    base, db, ids = live
    future = ids["run"] + 1
    browser.get(f"{base}/runs/{future}")
    assert f"No run {future} in this database yet" in browser.page_source
    with Database(db) as writer:
        assert writer.start_run({"proposer": "heuristic"}) == future
    assert wait_for(lambda: browser.execute_script("return document.body.dataset.page") == "run", 20)


def test_signing_in_from_a_deep_link_lands_on_that_page(reward_server, browser) -> None:
    """A run's address opened without a session asks to sign in, says which page, and signing in
    leads there (under the session's path), not to the index."""
    url, token = reward_server
    browser.get(f"{url}/watch/runs/1")
    assert wait_for(lambda: "/watch/login" in browser.current_url)
    assert "Sign in to see" in browser.page_source and "/watch/runs/1" in browser.page_source
    browser.find_element(By.NAME, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    assert wait_for(lambda: re.search(r"/watch/s/[A-Za-z0-9_-]{43}/runs/1$", urlsplit(browser.current_url).path))
    assert wait_for(lambda: browser.execute_script("return document.body.dataset.page") == "run")
    # a made-up target is not followed off the run pages
    browser.get(f"{url}/watch/login?next=//evil.example/x")
    assert browser.find_element(By.NAME, "next").get_attribute("value") == "/"


def test_the_run_page_at_a_phones_width_hides_nothing_sideways(live, browser) -> None:
    """At 480 px every table's rows stack into labelled lines: the page never scrolls sideways and
    every cell, written by the server or by the page's script, is on screen with its label."""
    base, _, ids = live
    browser.set_window_size(480, 1400)
    _open_run(browser, f"{base}/runs/{ids['run']}")
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    off = browser.execute_script(
        "return [...document.querySelectorAll('main td')].filter(td => td.getBoundingClientRect().right > "
        "window.innerWidth + 1).map(td => td.dataset.label)")
    assert off == []
    labels = browser.execute_script("return [...document.querySelectorAll('#tasks tbody tr:first-child td')]"
                                    ".map(td => td.dataset.label)")
    assert "vs torch.compile" in labels and "% of roofline" in labels
