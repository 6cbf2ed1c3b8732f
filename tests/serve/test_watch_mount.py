"""The run pages under `kernelrl serve`: behind the tokens, reachable by a page of the server
itself, refused to every other site."""

from __future__ import annotations

from pathlib import Path

import httpx
from serve_helpers import TOKEN, FakeBackend

from watch_fixtures import fill_search_run


def _server(start_server, token_file: Path, tmp_path: Path, **settings):
    db = tmp_path / "run.db"
    fill_search_run(db)
    return start_server(FakeBackend(), token_file=token_file, watch_db=db, **settings)


def _cookie(srv) -> str:
    return f"kernelrl_watch_{srv.port}"


BROWSER = {"Sec-Fetch-Site": "same-origin"}


def _sign_in(srv, token: str = TOKEN) -> httpx.Response:
    return httpx.post(srv.url + "/watch/login", data={"token": token}, headers={"Origin": srv.url, **BROWSER})


def _session(srv, reply: httpx.Response) -> tuple[str, str]:
    """(the cookie's value, the session's path) a sign-in set."""
    assert reply.status_code == 303, reply.text
    base = reply.headers["location"].rstrip("/")
    assert base.startswith("/watch/s/") and len(base.rsplit("/", 1)[1]) >= 22  # >= 128 bits, urlsafe
    (cookie,) = [c for c in reply.headers.get_list("set-cookie") if c.startswith(_cookie(srv) + "=")]
    value, *attrs = (part.strip() for part in cookie.split(";"))
    named = {a.split("=", 1)[0].lower(): a.partition("=")[2] for a in attrs}
    assert named["path"] == base  # sent by the browser under the session's path only
    return value.split("=", 1)[1], base


def _get(srv, path: str, cookie: str | None = None, **headers: str) -> httpx.Response:
    """A request with the cookie replayed as raw header (no jar deciding where it goes)."""
    sent = {**BROWSER, **headers, **({"Cookie": f"{_cookie(srv)}={cookie}"} if cookie is not None else {})}
    return httpx.get(srv.url + path, headers=sent)


def _pages(srv, base: str, cookie: str | None) -> int:
    return _get(srv, base + "/api/runs", cookie).status_code


def _sign_out(srv, key: str) -> httpx.Response:
    return httpx.post(srv.url + "/watch/logout", data={"key": key}, headers={"Origin": srv.url, **BROWSER})


def test_a_sign_in_opens_a_session_at_its_own_path_and_sign_out_ends_it(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path)
    cookie, base = _session(srv, _sign_in(srv))
    assert _pages(srv, base, cookie) == 200  # the right key and its cookie
    page = _get(srv, base + "/runs/1", cookie)
    assert page.status_code == 200 and f'data-api="{base}/api/runs/1"' in page.text  # the script polls here
    assert f"src=\"{base}/static/watch.js\"" in page.text and f"href='{base}/logout'" in page.text
    assert _get(srv, base + "/static/watch.js", cookie).status_code == 200
    assert _get(srv, base + "/runs/latest", cookie).headers["location"] == base + "/runs/1"
    assert _pages(srv, base, None) == 401  # the key alone is not a session
    again, base2 = _session(srv, _sign_in(srv))  # every sign-in: a new id and a new key
    assert again != cookie and base2 != base and _pages(srv, base2, again) == 200
    form = _get(srv, base + "/logout")
    key = base.rsplit("/", 1)[1]
    assert form.status_code == 200 and 'action="/watch/logout"' in form.text and f'value="{key}"' in form.text
    out = _sign_out(srv, key)
    assert out.status_code == 303 and out.headers["location"] == "/watch/login?signed_out=1"
    gone = out.headers["set-cookie"].lower()
    assert gone.startswith(_cookie(srv) + '=""') and f"path={base.lower()}" in gone and "max-age=0" in gone
    assert _pages(srv, base, cookie) == 401 and _pages(srv, base2, again) == 200  # that session alone ended
    # a session is its server's alone: another server on another port neither accepts it nor shares its name
    other = start_server(FakeBackend(), token_file=token_file, watch_db=tmp_path / "run.db",
                         db_path=tmp_path / "other.db")
    assert _cookie(other) != _cookie(srv)
    assert httpx.get(other.url + base2 + "/api/runs", headers={**BROWSER, "Cookie": f"{_cookie(other)}={again}"}
                     ).status_code == 401


def test_a_replayed_cookie_reads_nothing_without_its_key(start_server, token_file, tmp_path):
    """What a program on another port of this host gets from the browser is the cookie (browsers
    do not isolate cookies by port); replayed here, it opens no page: not at /watch/, not under
    another session's key, not under a made-up key."""
    srv = _server(start_server, token_file, tmp_path)
    signed_in = _sign_in(srv)
    stolen = signed_in.cookies[_cookie(srv)]
    plain = ("/watch/", "/watch/api/runs", "/watch/runs/1", "/watch/runs/latest", "/watch/static/watch.js")
    for path in plain:
        assert _get(srv, path, stolen).status_code == 401, path
    _, base = _session(srv, signed_in)
    _, other_base = _session(srv, _sign_in(srv))  # a live session of someone else: its key, not its cookie
    made_up = "/watch/s/" + "A" * 43
    for path in (*plain, other_base + "/", other_base + "/api/runs", made_up + "/", made_up + "/api/runs",
                 base + "x/api/runs", "/watch/s/" + "%2e%2e/api/runs"):
        r = _get(srv, path, stolen)
        assert r.status_code in (401, 404) and "runs" not in r.text, (path, r.status_code, r.text[:200])
        navigated = _get(srv, path, stolen, **{"Sec-Fetch-Mode": "navigate"})
        assert navigated.status_code in (303, 404) and "runs" not in navigated.text, path
    assert _pages(srv, base, stolen) == 200  # with its own key it still works (the key is the other half)


def test_a_browser_without_a_session_is_sent_to_sign_in(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path)
    for path, target in (("/watch/", "%2F"), ("/watch/runs/1", "%2Fruns%2F1"), ("/watch/s/" + "A" * 43 + "/", "%2F")):
        r = _get(srv, path, **{"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Site": "none"})
        assert r.status_code == 303 and r.headers["location"] == f"/watch/login?next={target}", path
    assert _get(srv, "/watch/api/runs", **{"Sec-Fetch-Mode": "cors"}).status_code == 401  # a script's fetch
    metrics = httpx.get(srv.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    assert 'rejected_total{reason="unauthorized"} 4' in metrics


def test_sessions_expire(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path, watch_session_hours=1 / 3600)  # one second
    reply = _sign_in(srv)
    cookie, base = _session(srv, reply)
    assert "max-age=1" in reply.headers["set-cookie"].lower()
    assert _pages(srv, base, cookie) == 200
    import time
    time.sleep(1.2)
    assert _pages(srv, base, cookie) == 401


def test_a_session_needs_its_cookie_and_its_key():
    from kernelrl.web.live import MAX_SESSIONS, Sessions

    now = [0.0]
    sessions = Sessions(session_s=10.0, clock=lambda: now[0])
    cookie, key = sessions.issue("alice")
    other_cookie, other_key = sessions.issue("bob")
    assert len(key) >= 22 and key != cookie
    assert sessions.client([cookie], key) == "alice" and sessions.client([other_cookie], other_key) == "bob"
    assert sessions.client([cookie], other_key) is None and sessions.client([other_cookie], key) is None
    assert sessions.client([], key) is None and sessions.client([""], key) is None and sessions.client([cookie], "") is None
    assert sessions.client(["forged", cookie], key) == "alice"  # one of the values the browser sent
    assert cookie not in repr(sessions._live) and key not in repr(sessions._live)  # held hashed
    sessions.end(key)
    assert sessions.client([cookie], key) is None and sessions.client([other_cookie], other_key) == "bob"
    now[0] = 10.0
    assert sessions.client([other_cookie], other_key) is None and len(sessions) == 0  # expired, and dropped
    first = sessions.issue("c")
    for _ in range(MAX_SESSIONS):
        sessions.issue("d")
    assert len(sessions) == MAX_SESSIONS and sessions.client([first[0]], first[1]) is None  # the oldest ended


def test_failed_sign_ins_are_limited_and_counted(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path, watch_login_attempts=3)
    for _ in range(3):
        r = _sign_in(srv, "y" * 40)
        assert r.status_code == 303 and "failed=1" in r.headers["location"]
    limited = _sign_in(srv)  # even the right token waits now: guessing stops here
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1 and not limited.cookies
    metrics = httpx.get(srv.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    assert 'rejected_total{reason="watch_login_failed"} 3' in metrics
    assert 'rejected_total{reason="watch_login_limited"} 1' in metrics


def test_the_sign_in_body_is_bounded_before_it_is_read(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path)
    headers = {"Origin": srv.url, **BROWSER, "Content-Type": "application/x-www-form-urlencoded"}
    declared = httpx.post(srv.url + "/watch/login", content=b"token=" + b"x" * (1 << 20), headers=headers)
    assert declared.status_code == 413

    def chunks():
        yield b"token="
        for _ in range(1024):
            yield b"x" * 1024  # 1 MiB, streamed without a length

    streamed = httpx.post(srv.url + "/watch/login", content=chunks(), headers=headers)
    assert streamed.status_code == 413


def test_the_pages_need_a_signed_in_browser_or_a_token(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path)
    assert httpx.get(srv.url + "/watch/api/runs").status_code == 401
    with_token = httpx.get(srv.url + "/watch/api/runs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert with_token.status_code == 200 and with_token.json()
    assert httpx.get(srv.url + "/watch/api/runs", cookies={_cookie(srv): "default:forged"}).status_code == 401
    assert _pages(srv, "/watch/s/" + "A" * 43, "forged") == 401


def test_signing_in_sets_a_session_the_pages_accept(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path)
    # what a browser sends: the form's post from the server's own page
    browser = {"Origin": srv.url, "Sec-Fetch-Site": "same-origin"}
    form = httpx.get(srv.url + "/watch/login", headers={"Sec-Fetch-Site": "none"})
    assert form.status_code == 200 and 'name=token' in form.text
    wrong = httpx.post(srv.url + "/watch/login", data={"token": "x" * 40}, headers=browser)
    assert wrong.status_code == 303 and "failed=1" in wrong.headers["location"] and not wrong.cookies
    right = httpx.post(srv.url + "/watch/login", data={"token": TOKEN}, headers=browser)
    assert right.status_code == 303 and _cookie(srv) in right.cookies
    assert "httponly" in right.headers["set-cookie"].lower() and "samesite=strict" in right.headers["set-cookie"].lower()
    base = right.headers["location"]
    page = httpx.get(srv.url + base, cookies=right.cookies, headers={"Sec-Fetch-Site": "same-origin"})
    assert page.status_code == 200 and "run" in page.text.lower()
    api = httpx.get(srv.url + base + "api/runs", cookies=right.cookies, headers=browser)
    assert api.status_code == 200


def test_another_site_cannot_use_the_pages_or_sign_in(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path)
    cookie, base = _session(srv, _sign_in(srv))
    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                    {"Origin": "http://attacker.example"}, {"Origin": "null"}):
        assert _get(srv, base + "/api/runs", cookie, **headers).status_code == 403, headers
        r = httpx.post(srv.url + "/watch/login", data={"token": TOKEN}, headers=headers)
        assert r.status_code == 403 and _cookie(srv) not in r.cookies, headers
        assert httpx.post(srv.url + "/watch/logout", data={"key": base.rsplit("/", 1)[1]},
                          headers=headers).status_code == 403, headers
    assert _get(srv, base + "/api/runs", cookie, Origin=srv.url.replace(str(srv.port), str(srv.port + 1))
                ).status_code == 403  # a page on another port of this host is another site's
    # a rebound host name is refused before anything else
    assert _get(srv, base + "/api/runs", cookie, Host="attacker.example").status_code == 403
    assert _pages(srv, base, cookie) == 200  # (and the session still works from its own pages)


def test_the_api_still_refuses_every_browser_request(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path)
    r = httpx.get(srv.url + "/v1/info", headers={"Authorization": f"Bearer {TOKEN}", "Origin": srv.url,
                                                  "Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 403
    form = httpx.post(srv.url + "/v1/evaluate", data={"items": "x"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert form.status_code == 415


def test_kernelrl_watch_alone_refuses_rebound_names_and_other_sites(tmp_path):
    from fastapi.testclient import TestClient

    from kernelrl.web.live import standalone_app

    db = tmp_path / "run.db"
    fill_search_run(db)
    client = TestClient(standalone_app(db, host="127.0.0.1"), base_url="http://127.0.0.1:8178")
    assert client.get("/api/runs").status_code == 200
    assert client.get("/api/runs", headers={"Sec-Fetch-Site": "same-origin"}).status_code == 200
    for headers in ({"Host": "attacker.example:8178"}, {"Origin": "http://attacker.example"},
                    {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"}):
        r = client.get("/api/runs", headers=headers)
        assert r.status_code in (400, 403) and "runs" not in r.json(), headers
    assert client.post("/api/runs", content=b"a=b",
                       headers={"Content-Type": "application/x-www-form-urlencoded"}).status_code == 415
