"""The run pages under `kernelrl serve`: behind the tokens, reachable by a page of the server
itself, refused to every other site."""

from __future__ import annotations

from pathlib import Path

import httpx
from serve_helpers import TOKEN, FakeBackend

from watch_fixtures import fill_search_run


def _server(start_server, token_file: Path, tmp_path: Path):
    db = tmp_path / "run.db"
    fill_search_run(db)
    return start_server(FakeBackend(), token_file=token_file, watch_db=db)


def test_the_pages_need_a_signed_in_browser_or_a_token(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path)
    assert httpx.get(srv.url + "/watch/api/runs").status_code == 401
    with_token = httpx.get(srv.url + "/watch/api/runs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert with_token.status_code == 200 and with_token.json()
    assert httpx.get(srv.url + "/watch/api/runs", cookies={"kernelrl_watch": "default:forged"}).status_code == 401


def test_signing_in_sets_a_session_the_pages_accept(start_server, token_file, tmp_path):
    srv = _server(start_server, token_file, tmp_path)
    # what a browser sends: the form's post from the server's own page
    browser = {"Origin": srv.url, "Sec-Fetch-Site": "same-origin"}
    form = httpx.get(srv.url + "/watch/login", headers={"Sec-Fetch-Site": "none"})
    assert form.status_code == 200 and 'name=token' in form.text
    wrong = httpx.post(srv.url + "/watch/login", data={"token": "x" * 40}, headers=browser)
    assert wrong.status_code == 303 and wrong.headers["location"].endswith("failed=1") and not wrong.cookies
    right = httpx.post(srv.url + "/watch/login", data={"token": TOKEN}, headers=browser)
    assert right.status_code == 303 and "kernelrl_watch" in right.cookies
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
        assert r.status_code == 403 and "kernelrl_watch" not in r.cookies, headers
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
