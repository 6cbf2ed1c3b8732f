"""A scripted OpenAI-compatible chat server on 127.0.0.1, for tests of everything that talks to
a model endpoint.

It speaks `POST /v1/chat/completions` (JSON in, JSON out with `usage` token counts) and
`GET /v1/models`. Replies come from a script (a queue of `Reply`): normal answers, malformed
ones, slow ones (`delay_s`), and HTTP errors (429 with Retry-After, 500, ...). When the script
is empty, `responder(body)` makes the reply; the default one answers every prompt with a
correct program for the task in it (it wraps the first python block of the prompt, the
reference, in a `ModelNew` under inference mode, with a per-request comment so every answer is
a distinct program). Every request body is recorded in `requests`, with its headers in
`headers`, so tests can inspect prompts and keys.

Use `with OpenAIServer() as server:` or the `openai_server` pytest fixture (import it into a
test module: `from openai_server import openai_server`).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

MODEL = "scripted-model"


@dataclass(kw_only=True)
class Reply:
    """One scripted response. `status` != 200 sends an OpenAI-style error body instead."""

    content: str | None = ""
    status: int = 200
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    finish_reason: str = "stop"
    prompt_tokens: int | None = None  # None: counted as whitespace-separated words of the messages
    completion_tokens: int | None = None  # None: words of the content
    include_usage: bool = True
    error_message: str | None = None  # the error body's message when status != 200

    @classmethod
    def ok(cls, content: str, **kw: Any) -> Reply:
        return cls(content=content, **kw)

    @classmethod
    def error(cls, status: int, *, retry_after_s: float | None = None, delay_s: float = 0.0,
              message: str | None = None) -> Reply:
        headers = {"retry-after": f"{retry_after_s:g}"} if retry_after_s is not None else {}
        return cls(content=None, status=status, headers=headers, delay_s=delay_s, error_message=message)

    @classmethod
    def slow(cls, content: str, delay_s: float) -> Reply:
        return cls(content=content, delay_s=delay_s)


def count_words(text: str) -> int:
    return len(text.split())


_FIRST_PY_BLOCK = re.compile(r"```python\n(.*?)\n```", re.DOTALL)


def echo_reference_responder() -> Callable[[dict[str, Any]], Reply]:
    """A responder whose answers are correct programs: the prompt's reference under inference mode."""
    counter = iter(range(1, 1 << 30))
    lock = threading.Lock()

    def respond(body: dict[str, Any]) -> Reply:
        from kernelrl.tasks.source import embed_reference

        with lock:
            n = next(counter)
        prompt = body["messages"][-1]["content"]
        m = _FIRST_PY_BLOCK.search(prompt)
        if not m:
            return Reply.ok("I found no reference program in the prompt.")
        code = (f"# scripted answer {n}\nimport torch\nimport torch.nn as nn\n\n{embed_reference(m.group(1))}\n\n\n"
                "class ModelNew(nn.Module):\n    def __init__(self, *args, **kwargs):\n        super().__init__()\n"
                "        self.inner = _Reference(*args, **kwargs)\n\n    def forward(self, *inputs):\n"
                "        with torch.inference_mode():\n            return self.inner(*inputs)\n")
        return Reply.ok(f"Analysis: autograd bookkeeping is wasted work here; inference mode removes it.\n\n"
                        f"```python\n{code}```\n")

    return respond


class OpenAIServer:
    """A threaded HTTP server on 127.0.0.1 with an ephemeral port; see the module docstring."""

    def __init__(self, script: Iterable[Reply] = (),
                 responder: Callable[[dict[str, Any]], Reply] | None = None) -> None:
        self.script: deque[Reply] = deque(script)
        self.responder = responder or echo_reference_responder()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        # shutdown() waits for the serving loop's next poll: 0.5 s by default, paid by every test's teardown
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="openai-server", daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def add(self, *replies: Reply) -> None:
        with self._lock:
            self.script.extend(replies)

    def prompts(self) -> list[str]:
        """The user message of every chat request, in arrival order."""
        with self._lock:
            return [r["messages"][-1]["content"] for r in self.requests if "messages" in r]

    def start(self) -> OpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            if self.script:
                return self.script.popleft()
        return self.responder(body)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                pass  # keep test output clean

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test): nothing to deliver

            def do_GET(self) -> None:  # noqa: N802 - stdlib name
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [
                        {"id": MODEL, "object": "model", "created": 0, "owned_by": "tests"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

            def do_POST(self) -> None:  # noqa: N802 - stdlib name
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                    return
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    self._send(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
                    return
                with server._lock:
                    server.requests.append(body)
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    reply = server._next_reply(body)
                    if reply.delay_s:
                        time.sleep(reply.delay_s)
                    self._answer(body, reply)
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _answer(self, body: dict[str, Any], reply: Reply) -> None:
                if reply.status != 200:
                    kind = "rate_limit_exceeded" if reply.status == 429 else "server_error"
                    self._send(reply.status, {"error": {"message": reply.error_message or f"scripted {reply.status}", "type": kind,
                                                        "code": kind}}, reply.headers)
                    return
                content = reply.content
                words_in = sum(count_words(str(m.get("content", ""))) for m in body.get("messages", []))
                prompt_tokens = reply.prompt_tokens if reply.prompt_tokens is not None else words_in
                completion_tokens = (reply.completion_tokens if reply.completion_tokens is not None
                                     else count_words(content or ""))
                payload: dict[str, Any] = {
                    "id": f"chatcmpl-{len(server.requests)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", MODEL),
                    "choices": [{"index": 0, "finish_reason": reply.finish_reason,
                                 "message": {"role": "assistant", "content": content}}],
                }
                if reply.include_usage:
                    payload["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                        "total_tokens": prompt_tokens + completion_tokens}
                self._send(200, payload, reply.headers)

        return Handler


@pytest.fixture
def openai_server():
    """A running scripted server; add replies with `openai_server.add(Reply.ok(...))`."""
    with OpenAIServer() as server:
        yield server
