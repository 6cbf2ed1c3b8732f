"""HTTP to one reward server, retried: what every `RewardClient` request goes through.

`Transport(url, token=..., config=ClientConfig(...))` sends one request (`request`), long-polls
(`long_poll`) and says whether the server answers (`healthy`); `ClientConfig` holds every limit
of the client, `ServeError` is what a request that cannot succeed raises.

Guarantees:
- transient failures are retried with exponential backoff and full jitter: connection errors,
  timeouts, 500/502/503/504 up to `retries` times per request, 429 (queue full) until
  `queue_wait_s` has passed; a Retry-After header is honoured (never retried sooner); every
  retry is counted by its reason in `retried` ("429", "503", "transport", ...);
- other client errors (400, 401, 403, 404, 409, 413, 415) raise `ServeError` at once with the
  server's message and status;
- every request ends: after `request_timeout_s` (plus its long poll), and never retried past the
  call's deadline (`ServeError` then).

Does not know the routes or what they answer (`kernelrl.backends.client` does).
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx

from kernelrl.checks.policy import PolicyName
from kernelrl.tasks.task import Size

RETRY_STATUSES = frozenset({500, 502, 503, 504})
DEFAULT_TIMEOUT_S = 3600.0  # one evaluate_batch or profile call, queueing included


class ServeError(Exception):
    """The server refused a request, could not finish a job, or could not be reached in time."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientConfig:
    size: Size | None = None  # None: the server's
    policy: PolicyName | None = None
    request_timeout_s: float = 60.0  # one HTTP request (a long poll adds its wait)
    retries: int = 8  # per request, for connection errors and 5xx
    backoff_s: float = 0.5  # first backoff; doubles per retry, full jitter
    backoff_max_s: float = 30.0
    queue_wait_s: float = 900.0  # keep retrying 429 (queue full) this long
    wait_s: float = 20.0  # long poll per job status request (the server holds at most 30 s)
    timeout_s: float = DEFAULT_TIMEOUT_S  # whole evaluate_batch or profile call; math.inf: no limit
    items_per_job: int | None = None  # None: the server's limit

    def __post_init__(self) -> None:
        if self.size is not None:
            object.__setattr__(self, "size", Size(self.size))
        if self.policy is not None:
            object.__setattr__(self, "policy", PolicyName(self.policy))
        if self.retries < 0 or self.backoff_s <= 0 or self.backoff_max_s < self.backoff_s:
            raise ValueError("need retries >= 0 and 0 < backoff_s <= backoff_max_s")
        if not 0 <= self.wait_s <= 30:
            raise ValueError("wait_s must be in 0..30 (the server's limit)")
        if self.request_timeout_s <= 0 or self.queue_wait_s < 0:
            raise ValueError("request_timeout_s must be positive and queue_wait_s >= 0")
        if self.items_per_job is not None and self.items_per_job < 1:
            raise ValueError("items_per_job must be >= 1")
        if not self.timeout_s > 0:
            raise ValueError("timeout_s must be positive (math.inf: no limit)")

    def deadline(self) -> float | None:
        """The monotonic time a call started now must end by; None without a limit."""
        return None if math.isinf(self.timeout_s) else time.monotonic() + self.timeout_s


class Transport:
    """The HTTP connection to one server and its retry rule. Thread-safe: several threads may share it."""

    def __init__(self, url: str, *, token: str | None, config: ClientConfig) -> None:
        self.url = url
        self.config = config
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=config.request_timeout_s)
        self.retried: Counter[str] = Counter()  # retries by reason ("429", "503", "transport", ...)
        self._lock = threading.Lock()

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, *, body: bytes | None = None, params: dict[str, Any] | None = None,
                 timeout_s: float | None = None, deadline: float | None = None) -> httpx.Response:
        cfg = self.config
        attempt = 0  # failures that count against `retries`
        backoffs = 0  # every retry, 429 included: the exponent of the backoff
        queue_deadline = time.monotonic() + cfg.queue_wait_s
        while True:
            retry_after = None
            try:
                resp = self.http.request(method, path, content=body, params=params,
                                          headers={"Content-Type": "application/json"} if body is not None else None,
                                          timeout=timeout_s or cfg.request_timeout_s)
            except httpx.TransportError as e:
                reason, last = "transport", f"{type(e).__name__}: {e}"
            else:
                if resp.status_code < 400:
                    return resp
                message = _error_message(resp)
                if resp.status_code == 429:
                    if time.monotonic() >= queue_deadline:
                        raise ServeError(f"the server's queue stayed full for {cfg.queue_wait_s:g} s: {message}",
                                         status=429)
                    reason, last = "429", message
                    retry_after = _retry_after(resp)
                elif resp.status_code in RETRY_STATUSES:
                    reason, last = str(resp.status_code), message
                    retry_after = _retry_after(resp) if resp.status_code == 503 else None
                else:
                    raise ServeError(f"{method} {path}: {resp.status_code} {message}", status=resp.status_code)
            if reason != "429":
                attempt += 1
                if attempt > cfg.retries:
                    raise ServeError(f"{method} {self.url}{path} failed after {cfg.retries} retries: {last}")
            pause = random.uniform(0, min(cfg.backoff_max_s, cfg.backoff_s * 2 ** min(backoffs, 16)))
            backoffs += 1
            if retry_after is not None:
                pause = max(pause, retry_after)
            if deadline is not None and time.monotonic() + pause > deadline:
                raise ServeError(f"{method} {self.url}{path}: gave up at the call's deadline ({last})")
            with self._lock:
                self.retried[reason] += 1
            time.sleep(pause)

    def healthy(self) -> bool:
        try:
            return self.http.get("/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def wait_within(self, deadline: float | None) -> float:
        if deadline is None:
            return self.config.wait_s
        left = deadline - time.monotonic()
        if left <= 0:
            raise ServeError("not done by the call's deadline; it goes on on the server")
        return min(self.config.wait_s, left)

    def long_poll(self, path: str, deadline: float | None) -> bytes:
        wait_s = self.wait_within(deadline)
        return self.request("GET", path, params={"wait": f"{wait_s:g}"}, timeout_s=self.config.request_timeout_s + wait_s,
                             deadline=deadline).content


def _error_message(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"])
    except (ValueError, KeyError, TypeError):
        return resp.text[:300] or resp.reason_phrase


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to the backoff
