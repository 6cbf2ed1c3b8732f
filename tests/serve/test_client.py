"""The client's retries: backoff on connection errors and 5xx, Retry-After honoured, keys that
make a retried submission safe, and no retry for a client error."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from serve_helpers import FakeBackend, fake_result, fast_client, free_port

from kernelrl.backends.client import DEFAULT_TIMEOUT_S, ClientConfig, RewardClient, ServeError
from kernelrl.serve.config import ServeConfig
from kernelrl.serve.server import RewardServer
from kernelrl.tasks.task import Task

TASK = Task(name="plus_one", source="import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                                    "        return x + 1\ndef get_inputs():\n    return [torch.randn(4)]\n"
                                    "def get_init_inputs():\n    return []\n")


class Scripted:
    """A real HTTP server on 127.0.0.1 whose answers to `GET /v1/info` follow a script."""

    def __init__(self, script: list[tuple[int, dict[str, str]]]) -> None:
        self.script = list(script)
        self.seen: list[float] = []
        app = FastAPI()

        @app.get("/v1/info")
        async def info(request: Request) -> JSONResponse:
            self.seen.append(time.monotonic())
            status, headers = self.script.pop(0) if self.script else (200, {})
            if status != 200:
                return JSONResponse({"error": f"scripted {status}"}, status_code=status, headers=headers)
            return JSONResponse({"backend": "local", "devices": ["cpu"], "size": "small", "policy": "open",
                                 "max_items_per_job": 8, "max_pending_items": 8, "max_body_bytes": 1000,
                                 "max_source_bytes": 100})

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Scripted:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def test_retry_after_is_honoured_and_5xx_retried() -> None:
    with Scripted([(503, {"Retry-After": "1"}), (502, {}), (500, {})]) as s:
        client = fast_client(s.url)
        info = client.info()
        assert info.max_items_per_job == 8
        assert len(s.seen) == 4
        assert s.seen[1] - s.seen[0] >= 1.0  # waited out Retry-After
        assert dict(client.retried) == {"503": 1, "502": 1, "500": 1}


def test_gives_up_after_the_retries() -> None:
    with Scripted([(503, {})] * 10) as s:
        client = RewardClient(s.url, config=ClientConfig(retries=2, backoff_s=0.01, backoff_max_s=0.02))
        with pytest.raises(ServeError, match="failed after 2 retries: scripted 503"):
            client.info()
        assert len(s.seen) == 3


def test_backoff_grows_and_is_jittered(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []
    monkeypatch.setattr("kernelrl.backends.transport.time.sleep", pauses.append)
    client = RewardClient(f"http://127.0.0.1:{free_port()}",  # nobody listens: connection refused
                          config=ClientConfig(retries=6, backoff_s=0.5, backoff_max_s=4.0))
    with pytest.raises(ServeError, match="ConnectError"):
        client.info()
    assert len(pauses) == 6
    caps = [min(4.0, 0.5 * 2 ** k) for k in range(6)]  # 0.5, 1, 2, 4, 4, 4
    assert all(0 <= p <= cap for p, cap in zip(pauses, caps))
    assert len(set(pauses)) == 6  # jittered, not a fixed schedule


@pytest.fixture
def late_server(tmp_path) -> Iterator[tuple[str, threading.Thread, list]]:
    """A server that starts listening 1.5 s after the test begins."""
    port = free_port()
    holder: list[RewardServer] = []

    def start() -> None:
        time.sleep(1.5)
        holder.append(RewardServer(ServeConfig(port=port, db_path=tmp_path / "late.db"),
                                   backend=FakeBackend()).start_in_thread())

    t = threading.Thread(target=start)
    t.start()
    yield f"http://127.0.0.1:{port}", t, holder
    t.join()
    for server in holder:
        server.stop()


def test_waits_for_a_server_that_is_not_up_yet(late_server) -> None:
    url, _, _ = late_server
    client = fast_client(url, retries=30)
    (res,) = client.evaluate_batch([(TASK, "a")])
    assert res.message == fake_result(TASK.name, "a").message
    assert client.retried["transport"] >= 1


def test_batches_are_split_to_the_server_limits(tmp_path) -> None:
    backend = FakeBackend()
    server = RewardServer(ServeConfig(port=0, db_path=tmp_path / "s.db", max_items_per_job=3, max_pending_items=6,
                                      max_body_bytes=4000), backend=backend).start_in_thread()
    try:
        client = fast_client(server.url)
        cands = [f"candidate {i} " + "x" * 300 for i in range(10)]
        results = client.evaluate_batch([(TASK, c) for c in cands])
        assert [r.message for r in results] == [fake_result(TASK.name, c).message for c in cands]
        assert server.service.store.stats(since=0).jobs["done"] >= 4  # 10 items, at most 3 per job
    finally:
        server.stop()


def test_retried_submission_is_not_evaluated_twice(tmp_path) -> None:
    """The server stores a job but the answer is lost: the retry (same keys) reuses it."""
    backend = FakeBackend()
    server = RewardServer(ServeConfig(port=0, db_path=tmp_path / "s.db"), backend=backend).start_in_thread()
    try:
        client = fast_client(server.url)
        real_request = client.transport.http.request
        calls = {"n": 0}

        def lose_first_answer(method: str, url: str, **kw: object) -> httpx.Response:
            resp = real_request(method, url, **kw)
            if method == "POST" and calls["n"] == 0:
                calls["n"] += 1
                raise httpx.ReadError("connection reset after the server stored the job")
            return resp

        client.transport.http.request = lose_first_answer  # type: ignore[method-assign]
        (res,) = client.evaluate_batch([(TASK, "only once")])
        assert res.message == fake_result(TASK.name, "only once").message
        assert client.retried["transport"] == 1
        assert backend.evaluated == [fake_result(TASK.name, "only once").candidate_hash]
        stats = server.service.store.stats(since=0)
        assert stats.jobs["done"] == 2 and stats.by_status == {"correct": 1}  # two jobs, one evaluation
    finally:
        server.stop()


def test_calls_time_out_by_default(tmp_path) -> None:
    """A server whose evaluator never answers: the call ends at the client's deadline, which
    every client has unless told to wait for ever."""
    assert math.isfinite(ClientConfig().timeout_s) and ClientConfig().timeout_s == DEFAULT_TIMEOUT_S
    assert ClientConfig(timeout_s=math.inf).deadline() is None
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        ClientConfig(timeout_s=0)
    gate = threading.Event()
    server = RewardServer(ServeConfig(port=0, db_path=tmp_path / "s.db"), backend=FakeBackend(gate=gate,
                                                                                               profile_gate=gate))
    server.start_in_thread()
    try:
        client = fast_client(server.url, timeout_s=1.5, wait_s=0.5)
        for call in (lambda: client.evaluate_batch([(TASK, "never judged")]), lambda: client.profile(TASK)):
            t0 = time.monotonic()
            with pytest.raises(ServeError, match="not done by the call's deadline"):
                call()
            assert 1.4 <= time.monotonic() - t0 < 5
    finally:
        gate.set()
        server.stop()
