"""Every connection and body is bounded in time and number (`kernelrl.web.http`), tested as an
attacker on loopback would: connections that send half a request head and wait, or trickle it a
byte at a time, or declare a body and never send it; more connections than the limit. Bounded:
at most 200 connections, each test under about 10 s."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from serve_helpers import FakeBackend

from kernelrl.web.http import HttpLimits

HEADER_TIMEOUT_S = 1.0


def _open(srv, first: bytes = b"GET /healthz HTTP/1.1\r\nHo") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    s.sendall(first)
    return s


def _closed(s: socket.socket, within_s: float) -> bool:
    """Whether the server closes the connection (EOF or reset) within `within_s`."""
    s.settimeout(within_s)
    try:
        return s.recv(1024) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


@contextmanager
def _flood(srv, n: int) -> Iterator[list[socket.socket]]:
    socks = []
    try:
        for _ in range(n):
            try:
                socks.append(_open(srv))
            except OSError:  # refused at once (over the limit): that is the point
                pass
        yield socks
    finally:
        for s in socks:
            s.close()


def _healthz_s(srv) -> float:
    t0 = time.monotonic()
    r = httpx.get(srv.url + "/healthz", timeout=10)
    assert r.status_code == 200
    return time.monotonic() - t0


@pytest.fixture
def srv(start_server):
    return start_server(FakeBackend(), header_timeout_s=HEADER_TIMEOUT_S, body_timeout_s=1.0, max_connections=64)


def test_a_half_sent_request_head_is_closed_after_the_header_timeout(srv):
    s = _open(srv)
    t0 = time.monotonic()
    assert _closed(s, HEADER_TIMEOUT_S + 2)
    assert HEADER_TIMEOUT_S - 0.2 < time.monotonic() - t0 < HEADER_TIMEOUT_S + 2
    s.close()


def test_a_trickled_request_head_is_closed_however_it_trickles(srv):
    s = _open(srv, b"G")
    t0 = time.monotonic()
    closed = False
    for byte in b"ET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100:
        try:
            s.sendall(bytes([byte]))
        except OSError:
            closed = True
            break
        time.sleep(0.1)
        if time.monotonic() - t0 > HEADER_TIMEOUT_S + 2:
            break
    assert closed or _closed(s, 1.0)
    assert time.monotonic() - t0 < HEADER_TIMEOUT_S + 2.5
    s.close()


def test_a_kept_alive_connection_that_trickles_its_next_request_is_closed(srv):
    s = _open(srv, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    s.settimeout(5)
    answer = b""
    while not answer.endswith(b'{"status":"ok"}'):
        answer += s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200")
    s.sendall(b"GET /heal")  # the next request head, never finished (keep-alive's timer stops here)
    t0 = time.monotonic()
    assert _closed(s, HEADER_TIMEOUT_S + 2)
    assert time.monotonic() - t0 < HEADER_TIMEOUT_S + 2
    s.close()


def test_a_body_that_does_not_arrive_is_refused_with_408(srv):
    s = _open(srv, b"POST /v1/evaluate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Content-Length: 1000\r\n\r\n{\"items\"")
    s.settimeout(5)
    t0 = time.monotonic()
    answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
    assert time.monotonic() - t0 < 3
    s.close()
    metrics = httpx.get(srv.url + "/metrics").text
    assert 'rejected_total{reason="body_timeout"} 1' in metrics


def test_answers_stay_fast_under_a_slow_connection_flood(srv):
    with _flood(srv, 50) as socks:  # under the connection limit
        assert len(socks) == 50
        assert max(_healthz_s(srv) for _ in range(5)) < 0.5
        t0 = time.monotonic()
        assert all(_closed(s, max(0.05, HEADER_TIMEOUT_S + 2 - (time.monotonic() - t0))) for s in socks)
    metrics = httpx.get(srv.url + "/metrics").text
    assert 'rejected_total{reason="header_timeout"} 50' in metrics


@pytest.fixture
def flood_srv(start_server):
    # A header timeout the flood cannot outlast on a loaded machine, so what closes a connection
    # here is the connection limit alone. With 1 s, floods slowed by load (CI; 4 of 6 runs beside
    # three busy loops) found some of their newest connections closed; with 30 s, 8 of 8 passed.
    return start_server(FakeBackend(), header_timeout_s=30.0, body_timeout_s=1.0, max_connections=64)


def test_a_flood_past_the_connection_limit_evicts_itself(flood_srv):
    srv = flood_srv
    with _flood(srv, 200) as socks:  # far past max_connections=64
        assert not any(_closed(s, 0.01) for s in socks[-8:])  # the newest are held (for the header timeout)
        assert all(_closed(s, 0.01) for s in socks[:8])  # the oldest made room for them
        # a client sending its request at once is answered during the flood: its connection
        # evicts the one that has waited longest for a request head
        assert max(_healthz_s(srv) for _ in range(5)) < 1.0
        dropped = sum(_closed(s, 0.01) for s in socks)
        assert dropped >= 200 - 64, dropped
    assert 'rejected_total{reason="connection_limit"}' in httpx.get(srv.url + "/metrics").text


def test_the_limits_are_validated_and_fit_the_descriptor_limit():
    import resource

    for bad in ({"header_timeout_s": 0}, {"body_timeout_s": -1}, {"max_connections": 0}, {"max_header_bytes": 10}):
        with pytest.raises(ValueError):
            HttpLimits(**bad)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert HttpLimits(max_connections=1 << 20).connection_limit() <= max(8, soft - 128 - 64)
