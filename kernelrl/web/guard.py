"""The request guard: what a web page could send is refused before any route (or the token) is looked at.

A browser lets any page send requests to 127.0.0.1 (cross-site request forgery: a `text/plain`
POST needs no preflight) and, through DNS rebinding, read the answers (the page's own host name
resolves to 127.0.0.1, so the browser treats the server as the page's origin). The reward
server has no browser client, so `RequestGuard`, an ASGI middleware around the whole app,
refuses on every route (/healthz and unknown paths included):

- a `Host` header whose host name is not on the allow-list (403): a rebound name never is; the
  list is `default_hosts` (loopback names, the address listened on, this machine's names) plus
  the `allowed_hosts` configured, or any host when that holds `*` (which needs a token);
- any `Origin` header, and a `Sec-Fetch-Site` header other than `none` (403): browsers add them
  to what pages send, no other client needs them;
- a request with a body (any POST, or a declared length or chunked body on another method)
  whose `Content-Type` is not `application/json` (415): a page cannot send JSON across origins
  without a CORS preflight, which is refused as well (it carries an Origin).

Where the server serves pages to browsers (`pages`: the run pages under `/watch`,
`kernelrl.web.live`), requests a page of this very server sends are let through:
`Sec-Fetch-Site` of `none` or `same-origin`, an `Origin` naming the same host and port, and on
the sign-in and sign-out forms' posts a form body; a page of any other site is still refused
(`Origin: null`, what a sandboxed or a no-referrer page sends, included). `pages=""` makes every
path a page (`kernelrl watch` alone).

Refusals are `{"error": ...}` JSON answers like every other error, counted by reason
(`forbidden_host`, `forbidden_origin`, `unsupported_media_type`).

Does not replace the token: a program on this machine (or on the network, off loopback) sends
whatever headers it likes.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the ASGI types, as the web framework spells them
    from starlette.types import ASGIApp as App
    from starlette.types import Receive, Scope, Send

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_ADDRESSES = frozenset({"0.0.0.0", "::", ""})
# A Host header: a DNS name or IPv4 address, or a bracketed IPv6 address, and an optional port.
_HOST = re.compile(r"^(?:\[(?P<ip6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9.-]+))(?::[0-9]{1,5})?$")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def default_hosts(listen_host: str) -> frozenset[str]:
    """Host names a client of a server listening on `listen_host` may use: the loopback names,
    the address itself, and, off loopback, this machine's names and their addresses."""
    hosts = set(LOOPBACK_NAMES)
    listen = listen_host.strip("[]").lower()
    if listen not in WILDCARD_ADDRESSES:
        hosts.add(listen)
    if not is_loopback(listen):
        names = {socket.gethostname().lower(), socket.getfqdn().lower()}
        hosts |= names
        for name in names:
            try:
                hosts |= {str(info[4][0]).lower() for info in socket.getaddrinfo(name, None)}
            except OSError:  # a machine name that does not resolve: its name alone
                pass
    return frozenset(h for h in hosts if h)


def host_name(value: str) -> str | None:
    """The host name of a Host header (lower case, no port, IPv6 without brackets), or None."""
    m = _HOST.match(value.strip().lower())
    if m is None:
        return None
    return m.group("ip6") or m.group("name")


def is_json(content_type: str) -> bool:
    media, _, _ = content_type.partition(";")
    return media.strip().lower() == "application/json"


class RequestGuard:
    """ASGI middleware: refuses foreign hosts, browser requests and non-JSON bodies (see the module)."""

    def __init__(self, app: App, *, allowed_hosts: frozenset[str] | None,
                 on_refuse: Callable[[str], None] | None = None, pages: str | None = None) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts  # None: any host
        self.on_refuse = on_refuse
        # Where this server serves pages to browsers (the run pages, `kernelrl.web.live`):
        # there, what a page of this very server sends is let through.
        self.pages = pages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, reason, message = refusal
        if self.on_refuse is not None:
            self.on_refuse(reason)
        body = json.dumps({"error": message}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """(status, reason, message) when the request is refused, else None."""
        headers: dict[str, list[str]] = {}
        for key, value in scope["headers"]:
            headers.setdefault(key.decode("latin-1").lower(), []).append(value.decode("latin-1"))
        hosts = headers.get("host", [])
        name = host_name(hosts[0]) if len(hosts) == 1 else None
        if name is None:
            return 400, "forbidden_host", "the request needs exactly one well-formed Host header"
        if self.allowed_hosts is not None and name not in self.allowed_hosts:
            return 403, "forbidden_host", (f"host {name[:100]!r} is not served here (a rebound DNS name?); "
                                           "start the server with --allowed-hosts NAME to serve it")
        path = str(scope.get("path", ""))
        pages = self.pages is not None and (path == self.pages or path.startswith(self.pages + "/"))
        if pages:
            if not _same_origin(headers, hosts[0]):
                return 403, "forbidden_origin", "the run pages answer only pages of this server"
        elif "origin" in headers or any(v.strip().lower() != "none" for v in headers.get("sec-fetch-site", [])):
            return 403, "forbidden_origin", ("requests sent by web pages (Origin or Sec-Fetch-Site headers) are "
                                             "refused: this API has no browser clients")
        declared = headers.get("content-length", ["0"])
        has_body = (scope["method"] in _BODY_METHODS or "transfer-encoding" in headers
                    or any(v.strip() not in ("", "0") for v in declared))
        if has_body:
            types = headers.get("content-type", [])
            form = (pages and scope["method"] == "POST" and path in (f"{self.pages}/login", f"{self.pages}/logout")
                    and len(types) == 1
                    and types[0].partition(";")[0].strip().lower() == "application/x-www-form-urlencoded")
            if not form and (len(types) != 1 or not is_json(types[0])):
                shown = types[0][:100] if types else "none"
                return 415, "unsupported_media_type", (f"a request body must be JSON (Content-Type: "
                                                       f"application/json), not {shown}")
        return None


def _same_origin(headers: dict[str, list[str]], host: str) -> bool:
    """A request a page of this very server sent (or one typed into the address bar)."""
    sites = [v.strip().lower() for v in headers.get("sec-fetch-site", [])]
    if any(s not in ("none", "same-origin") for s in sites):
        return False
    origins = headers.get("origin", [])
    if not origins:
        return True
    if len(origins) != 1:
        return False
    _, sep, rest = origins[0].strip().lower().partition("://")
    return bool(sep) and rest == host.strip().lower()
