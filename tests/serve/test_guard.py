"""What a web page can send to the server is refused on every route: a foreign Host (DNS
rebinding), an Origin or cross-site fetch (CSRF), and a body that is not JSON."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from serve_helpers import TOKEN, FakeBackend

from kernelrl.serve.config import ServeConfig
from kernelrl.web.guard import default_hosts, host_name

TASK_SOURCE = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n"
               "def get_inputs():\n    return [torch.randn(4)]\ndef get_init_inputs():\n    return []\n")
EVALUATE = {"items": [{"task": TASK_SOURCE, "candidate": "x"}]}
PROFILE = {"task": TASK_SOURCE}
JOB = "/v1/jobs/" + "0" * 32
SESSION = "/v1/sessions/" + "0" * 32


# Every route of the app (method, path template), and a request to it with a valid JSON body
# where the route takes one; an unknown path is sent as well.
ROUTES = {("GET", "/healthz"): ("/healthz", None), ("GET", "/v1/info"): ("/v1/info", None),
          ("GET", "/metrics"): ("/metrics", None), ("GET", "/v1/jobs/{job_id}"): (JOB, None),
          ("POST", "/v1/evaluate"): ("/v1/evaluate", EVALUATE), ("POST", "/v1/profile"): ("/v1/profile", PROFILE),
          ("POST", "/v1/sessions"): ("/v1/sessions", PROFILE), ("GET", "/v1/sessions/{session_id}"): (SESSION, None),
          ("DELETE", "/v1/sessions/{session_id}"): (SESSION, None),
          ("GET", "/v1/sessions/{session_id}/prompt"): (SESSION + "/prompt", None),
          ("POST", "/v1/sessions/{session_id}/turns"): (SESSION + "/turns", {"candidate": "x"}),
          ("GET", "/v1/sessions/{session_id}/turns/{number}"): (SESSION + "/turns/1", None),
          ("GET", "/no/such/path"): ("/no/such/path", None)}


def requests(url: str) -> list[tuple[str, str, dict | None]]:
    return [(method, path, body) for (method, _), (path, body) in ROUTES.items()]


def pending_or_done(srv) -> int:
    return sum(srv.service.store.stats(since=0).jobs.values())


@pytest.fixture(params=["no token", "token"])
def server(request, start_server, token_file: Path):
    backend = FakeBackend()
    settings = {"token_file": token_file} if request.param == "token" else {}
    return start_server(backend, **settings), backend


def send(url: str, method: str, path: str, body: dict | None, headers: dict[str, str]) -> httpx.Response:
    return httpx.request(method, url + path, json=body, headers={"Authorization": f"Bearer {TOKEN}", **headers})


def test_every_route_is_covered(server) -> None:
    srv, _ = server
    app = srv._server.config.app
    served = {(method, route.path) for route in app.routes for method in getattr(route, "methods", ())
              if method != "HEAD"}
    assert served == set(ROUTES) - {("GET", "/no/such/path")}


def test_a_foreign_host_is_refused_on_every_route(server) -> None:
    srv, backend = server
    port = srv.port
    for method, path, body in requests(srv.url):
        # A page on attacker.example, rebound to 127.0.0.1: the browser sends the page's host name.
        for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.attacker.example:{port}",
                     f"evil@127.0.0.1:{port}"):
            r = send(srv.url, method, path, body, {"Host": host})
            assert r.status_code in (400, 403), (method, path, host, r.status_code)
            assert "host" in r.json()["error"].lower()
    # The names a client on this machine uses are served.
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", "127.0.0.1"):
        assert send(srv.url, "GET", "/healthz", None, {"Host": host}).status_code == 200, host
    assert backend.batches == 0 and pending_or_done(srv) == 0


def test_a_web_page_request_is_refused_on_every_route(server) -> None:
    srv, _ = server
    for method, path, body in requests(srv.url):
        for headers in ({"Origin": "http://attacker.example"}, {"Origin": "null"}, {"Origin": srv.url},
                        {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):
            r = send(srv.url, method, path, body, headers)
            assert r.status_code == 403 and "web pages" in r.json()["error"], (method, path, headers, r.text)
    # a preflight is a request with an Origin too
    r = httpx.options(srv.url + "/v1/evaluate", headers={"Origin": "http://attacker.example",
                                                         "Access-Control-Request-Method": "POST"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    # A person typing the address in a browser (Sec-Fetch-Site: none) may read /healthz.
    assert send(srv.url, "GET", "/healthz", None, {"Sec-Fetch-Site": "none"}).status_code == 200


def test_a_body_that_is_not_json_is_refused_on_every_route(server) -> None:
    srv, _ = server
    raw = b'{"items": [{"task": "level1/softmax", "candidate": "x"}]}'
    for method, path, _ in requests(srv.url):
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                             "application/jsonp", None):
            headers = {"Authorization": f"Bearer {TOKEN}"}
            if content_type:
                headers["Content-Type"] = content_type
            r = httpx.request(method, srv.url + path, content=raw, headers=headers)
            assert r.status_code == 415, (method, path, content_type, r.status_code)
            assert "must be JSON" in r.json()["error"]
    # A POST without a body and without a content type is refused too; JSON with a charset is fine.
    assert httpx.post(srv.url + "/v1/evaluate", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 415
    r = httpx.post(srv.url + "/v1/evaluate", content=raw, headers={"Authorization": f"Bearer {TOKEN}",
                                                                   "Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 202 and pending_or_done(srv) == 1


def test_the_csrf_post_queues_nothing(server) -> None:
    """The request of the report: a text/plain POST from a page, with its own Origin and Host."""
    srv, backend = server
    raw = b'{"items": [{"task": "level1/softmax", "candidate": "import os; os.system(\'id\')"}]}'
    r = httpx.post(srv.url + "/v1/evaluate", content=raw,
                   headers={"Content-Type": "text/plain", "Origin": "http://attacker.example",
                            "Host": f"attacker.example:{srv.port}"})
    assert r.status_code == 403 and "attacker.example" in r.json()["error"]  # the Host is looked at first
    # Each defence holds alone: the same page on the server's own host name, or a simple form post.
    r = httpx.post(srv.url + "/v1/evaluate", content=raw,
                   headers={"Content-Type": "text/plain", "Origin": "http://attacker.example"})
    assert r.status_code == 403
    r = httpx.post(srv.url + "/v1/evaluate", content=raw, headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    assert pending_or_done(srv) == 0 and backend.batches == 0
    metrics = httpx.get(srv.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    assert 'kernelrl_serve_rejected_total{reason="forbidden_host"} 1' in metrics
    assert 'kernelrl_serve_rejected_total{reason="forbidden_origin"} 1' in metrics
    assert 'kernelrl_serve_rejected_total{reason="unsupported_media_type"} 1' in metrics


def test_allowed_hosts_add_names(start_server, token_file: Path) -> None:
    srv = start_server(FakeBackend(), allowed_hosts=("rewards.internal",))
    assert httpx.get(srv.url + "/healthz", headers={"Host": "rewards.internal:8177"}).status_code == 200
    assert httpx.get(srv.url + "/healthz", headers={"Host": "other.internal"}).status_code == 403
    anyhost = start_server(FakeBackend(), token_file=token_file, allowed_hosts=("*",), db_path=token_file.parent / "b.db")
    assert httpx.get(anyhost.url + "/healthz", headers={"Host": "other.internal"}).status_code == 200
    # Origin stays refused whatever the hosts.
    assert httpx.get(anyhost.url + "/healthz", headers={"Origin": "http://other.internal"}).status_code == 403


def test_allowed_hosts_are_checked() -> None:
    assert ServeConfig(allowed_hosts="a.example, B.example").allowed_hosts == ("a.example", "b.example")
    for bad in ("http://a.example", "a.example:80", "a.example/x", "[::1]", "a b"):
        with pytest.raises(ValueError, match="not a host name"):
            ServeConfig(allowed_hosts=(bad,))
    with pytest.raises(ValueError, match="needs a token file"):
        ServeConfig(allowed_hosts=("*",))


def test_host_names() -> None:
    assert host_name("LocalHost:8177") == "localhost"
    assert host_name("[::1]:8177") == "::1" and host_name("127.0.0.1") == "127.0.0.1"
    for bad in ("evil@127.0.0.1", "127.0.0.1:80:80", "a b", "", "[::1", "127.0.0.1:port"):
        assert host_name(bad) is None, bad
    loopback = default_hosts("127.0.0.1")
    assert {"localhost", "127.0.0.1", "::1"} <= loopback and socket.gethostname().lower() not in loopback
    assert socket.gethostname().lower() in default_hosts("0.0.0.0")
