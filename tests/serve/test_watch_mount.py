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


def _sign_in(srv, token: str = TOKEN, cookies=None) -> httpx.Response:
    return httpx.post(srv.url + "/watch/login", data={"token": token}, cookies=cookies,
                      headers={"Origin": srv.url, **BROWSER})


def _pages(srv, cookies) -> int:
    return httpx.get(srv.url + "/watch/api/runs", cookies=cookies, headers=BROWSER).status_code


def test_a_sign_in_rotates_the_session_and_sign_out_ends_it(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path)
    first = _sign_in(srv).cookies
    assert _pages(srv, first) == 200
    second = _sign_in(srv, cookies=first).cookies  # signing in again with the old cookie
    assert second[_cookie(srv)] != first[_cookie(srv)]
    assert _pages(srv, first) == 401 and _pages(srv, second) == 200  # the old id ended at sign-in
    form = httpx.get(srv.url + "/watch/logout", headers=BROWSER)
    assert form.status_code == 200 and 'action="/watch/logout"' in form.text
    out = httpx.post(srv.url + "/watch/logout", cookies=second, content=b"",
                     headers={"Origin": srv.url, **BROWSER, "Content-Type": "application/x-www-form-urlencoded"})
    assert out.status_code == 303 and out.headers["location"] == "/watch/login"
    assert _pages(srv, second) == 401
    # an id is this server's alone: another server on another port neither accepts it nor shares its name
    other = start_server(FakeBackend(), token_file=token_file, watch_db=tmp_path / "run.db",
                         db_path=tmp_path / "other.db")
    mine = _sign_in(srv).cookies[_cookie(srv)]
    assert _cookie(other) != _cookie(srv)
    assert _pages(other, {_cookie(other): mine}) == 401


def test_sessions_expire(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path, watch_session_hours=1 / 3600)  # one second
    cookies = _sign_in(srv).cookies
    assert "max-age=1" in _sign_in(srv).headers["set-cookie"].lower()
    assert _pages(srv, cookies) == 200
    import time
    time.sleep(1.2)
    assert _pages(srv, cookies) == 401


def test_failed_sign_ins_are_limited_and_counted(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path, watch_login_attempts=3)
    for _ in range(3):
        r = _sign_in(srv, "y" * 40)
        assert r.status_code == 303 and r.headers["location"].endswith("failed=1")
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


def test_signing_in_sets_a_session_the_pages_accept(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path)
    # what a browser sends: the form's post from the server's own page
    browser = {"Origin": srv.url, "Sec-Fetch-Site": "same-origin"}
    form = httpx.get(srv.url + "/watch/login", headers={"Sec-Fetch-Site": "none"})
    assert form.status_code == 200 and 'name=token' in form.text
    wrong = httpx.post(srv.url + "/watch/login", data={"token": "x" * 40}, headers=browser)
    assert wrong.status_code == 303 and wrong.headers["location"].endswith("failed=1") and not wrong.cookies
    right = httpx.post(srv.url + "/watch/login", data={"token": TOKEN}, headers=browser)
    assert right.status_code == 303 and _cookie(srv) in right.cookies
    assert "httponly" in right.headers["set-cookie"].lower() and "samesite=strict" in right.headers["set-cookie"].lower()
    page = httpx.get(srv.url + "/watch/", cookies=right.cookies, headers={"Sec-Fetch-Site": "same-origin"})
    assert page.status_code == 200 and "run" in page.text.lower()
    api = httpx.get(srv.url + "/watch/api/runs", cookies=right.cookies, headers=browser)
    assert api.status_code == 200


def test_another_site_cannot_use_the_pages_or_sign_in(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path)
    cookies = httpx.post(srv.url + "/watch/login", data={"token": TOKEN},
                         headers={"Origin": srv.url, "Sec-Fetch-Site": "same-origin"}).cookies
    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                    {"Origin": "http://attacker.example"}, {"Origin": "null"}):
        assert httpx.get(srv.url + "/watch/api/runs", cookies=cookies, headers=headers).status_code == 403, headers
        r = httpx.post(srv.url + "/watch/login", data={"token": TOKEN}, headers=headers)
        assert r.status_code == 403 and _cookie(srv) not in r.cookies, headers
    # a rebound host name is refused before anything else
    assert httpx.get(srv.url + "/watch/api/runs", cookies=cookies,
                     headers={"Host": "attacker.example"}).status_code == 403


def test_the_api_still_refuses_every_browser_request(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path)
    r = httpx.get(srv.url + "/v1/info", headers={"Authorization": f"Bearer {TOKEN}", "Origin": srv.url,
                                                  "Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 403
    form = httpx.post(srv.url + "/v1/evaluate", data={"items": "x"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert form.status_code == 415


def test_kernelrl_watch_alone_refuses_rebound_names_and_other_sites(tmp_path):
    from fastapi.testclient import TestClient

    from kernelrl.serve.watch import standalone_app

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
