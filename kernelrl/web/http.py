"""HTTP limits every server of this package runs under (the reward server, `kernelrl watch`).

A client on the network (or any program on this machine) can open connections and send nothing,
or a byte a second; uvicorn alone waits for ever on a request's headers (its keep-alive timeout
runs only between requests), so a few hundred such connections exhaust the process's file
descriptors and nothing is answered any more. `HttpLimits` bounds each connection:

- `header_timeout_s`: a connection that has not sent a whole request head this long after it
  opened (or after its previous answer, or after its first byte of a new request) is closed;
- `max_header_bytes`: h11 refuses a request head larger than this (400);
- `keep_alive_s`: an idle kept-alive connection is closed after this;
- `max_connections`: connections open at once, kept below the process's descriptor limit (less
  what the process needs and one accept burst, `ACCEPT_BATCH`); when
  one more is accepted, the connection that has waited longest for its request head is closed
  to make room (or, when none is waiting, the new one), counted as `connection_limit`;
- `body_timeout_s`: `read_body` (every route that reads a body uses it) gives up with 408 when
  the body has not arrived whole this long after the route began reading it, and with 413 as
  soon as it passes its route's limit (declared or streamed), before anything is parsed.

Guarantees: under a flood of slow connections, each is closed after `header_timeout_s`, no
more than `max_connections` are held, and a new connection evicts the slowest of them, so a
client that sends its request at once is answered during the flood
(`tests/serve/test_http_limits.py`). Does not guarantee fairness between clients that send
whole requests (a flood of real, slow requests can take every connection), and does not bound a
response's sending time to a client that reads slowly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # uvicorn and starlette are imported where a server starts, not to check a config's limits
    import uvicorn
    from starlette.requests import Request
    from uvicorn.protocols.http.h11_impl import H11Protocol

DESCRIPTORS_KEPT = 128  # file descriptors left for the databases, workers' pipes and logs
# Connections accepted in one go (asyncio accepts up to the backlog before any is handled), and the
# listen queue: kept small, so a burst cannot take descriptors past the limit before eviction runs.
ACCEPT_BATCH = 64


@dataclass(frozen=True, kw_only=True)
class HttpLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 120.0
    keep_alive_s: float = 5.0
    max_connections: int = 512
    max_header_bytes: int = 16 << 10

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            if not 0 < getattr(self, name) <= 3600:
                raise ValueError(f"{name} must be in (0, 3600] seconds")
        if not 1 <= self.max_connections <= 1 << 20:
            raise ValueError("max_connections must be in 1..1048576")
        if not 1024 <= self.max_header_bytes <= 1 << 20:
            raise ValueError("max_header_bytes must be in 1024..1048576")

    def connection_limit(self) -> int:
        """`max_connections`, lowered to fit the process's open-file limit (less what the rest
        of the process needs)."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(8, min(self.max_connections, soft - DESCRIPTORS_KEPT - ACCEPT_BATCH))


def bounded_protocol(limits: HttpLimits, on_refuse: Callable[[str], None] | None = None) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the header timeout and the connection limit of `limits`."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    most = limits.connection_limit()
    armed = itertools.count()  # the order request-head waits began in (loop.time() ties within a burst)

    class BoundedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _waiting_after: Any = None  # the request cycle that was current when the timer was set

        _armed_at = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > most:
                # Make room: the connection that has waited longest for its request head goes (a
                # flood of slow connections evicts itself); when none waits, this one goes.
                waiting = [c for c in self.connections if isinstance(c, BoundedH11Protocol) and c is not self
                           and c._waiting_for_head()]
                victim = min(waiting, key=lambda c: c._armed_at) if waiting else self
                if on_refuse is not None:
                    on_refuse("connection_limit")
                victim.transport.abort()
                if victim is self:
                    return
            self._arm()

        def _waiting_for_head(self) -> bool:
            return self._deadline is not None and self.cycle is self._waiting_after and not self.transport.is_closing()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            idle = self.cycle is None or self.cycle.response_complete
            if idle and (self._deadline is None or self._waiting_after is not self.cycle):
                self._arm()  # a new request head begins: it has header_timeout_s to arrive whole
            super().data_received(data)

        def _arm(self) -> None:
            self._disarm()
            self._waiting_after = self.cycle
            self._armed_at = next(armed)
            self._deadline = self.loop.call_later(limits.header_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            started = self.cycle is not self._waiting_after
            if not started and not self.transport.is_closing():
                if on_refuse is not None:
                    on_refuse("header_timeout")
                self.transport.abort()

    return BoundedH11Protocol


def uvicorn_config(app: Any, limits: HttpLimits, *, log_level: str = "warning",
                   on_refuse: Callable[[str], None] | None = None, **settings: Any) -> uvicorn.Config:
    """A uvicorn config with `limits` applied (h11, the bounded protocol, keep-alive)."""
    import uvicorn

    return uvicorn.Config(app, http=bounded_protocol(limits, on_refuse), log_level=log_level, access_log=False,
                          timeout_keep_alive=max(1, round(limits.keep_alive_s)),
                          h11_max_incomplete_event_size=limits.max_header_bytes, backlog=ACCEPT_BATCH, **settings)


class BodyError(Exception):
    """A body that cannot be read: status (400, 408 or 413) and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def read_body(request: Request, *, limit: int, timeout_s: float) -> bytes:
    """The request's body, refused (`BodyError`) with 413 as soon as it is declared or streamed
    past `limit` bytes, and with 408 when it has not arrived whole within `timeout_s`."""
    from starlette.requests import ClientDisconnect

    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BodyError(400, "bad Content-Length header") from None
        if size > limit:
            raise BodyError(413, f"the body is {size} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    total = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                total += len(chunk)
                if total > limit:
                    raise BodyError(413, f"the body passed the limit of {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise BodyError(408, f"the body did not arrive within {timeout_s:g} s") from None
    except ClientDisconnect:
        raise BodyError(400, "the client left before sending its body") from None
    return b"".join(chunks)


def limits_of(config: object) -> HttpLimits:
    """The `HttpLimits` fields of a config that has them (`ServeConfig`)."""
    return HttpLimits(**{f.name: getattr(config, f.name) for f in dataclasses.fields(HttpLimits)})
