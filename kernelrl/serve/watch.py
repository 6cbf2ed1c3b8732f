"""The run pages (`kernelrl.report.watch`) under the reward server, behind its tokens; and
`kernelrl watch` alone, behind the same request guard.

`kernelrl serve --watch-db runs/x.db` serves the pages of that run database at `/watch/`. A
browser cannot send a bearer token, so a person signs in once: `GET /watch/login` is a form that
posts the client's token; a right token starts a session (`Sessions`): a random id, kept in this
process only, in a cookie named after the server's port (`kernelrl_watch_<port>`; `HttpOnly`,
`SameSite=Strict`, path `/watch`, `Max-Age` its lifetime). Every `/watch` route accepts either
the cookie or `Authorization: Bearer TOKEN` (programs). `GET /watch/logout` is a form whose post
ends the session.

The request guard (`kernelrl.serve.guard`) refuses browser requests everywhere else; under
`/watch` it lets through what a page of this very server sends (`Sec-Fetch-Site: same-origin`, an
`Origin` naming the same host), and, on the sign-in and sign-out posts only, a form body. The
sign-in page's `Referrer-Policy` is `same-origin`, so a browser's post from it names its origin
(with `no-referrer` it sends `Origin: null`, which the guard refuses: a sandboxed page of any
site sends the same). A page of another site is still refused, and a rebound host name is
refused as before.

Guarantees:
- a session ends after `session_s` (12 h by default), at sign-out, or when the server stops; a
  sign-in always starts a new session (the one the browser held ends), so a session id seen
  before sign-in is worthless after it; ids are 256 random bits, held hashed, at most
  `MAX_SESSIONS` at once (the oldest ends first);
- a session is valid only at the server that issued it (ids live in its memory), and cookies of
  servers on other ports have other names, so signing in to one never signs another out;
- sign-in bodies are read only up to `MAX_FORM_BYTES` (413 past it) and within the body timeout;
  failed sign-ins are counted (`rejected_total{reason="watch_login_failed"}`) and limited: after
  `login_attempts` failures within a minute, every sign-in is answered 429 (`Retry-After`) until
  the oldest of them is a minute old (`watch_login_limited`);
- `kernelrl watch` alone (`run_standalone`) runs behind `RequestGuard` with every path a page:
  a foreign Host (DNS rebinding), another site's page (Origin, Sec-Fetch-Site) and a body that is
  not JSON are refused, and the HTTP limits of `kernelrl.serve.http` hold.

Does not guarantee: cookies are not isolated by port in browsers, so any program listening on
another port of the same host name receives this cookie; it is worth a session here until it
ends (sign out, or its lifetime). Without tokens (a loopback server with no token file, or
`kernelrl watch`) the pages are open to whoever can reach the port, as the API is.
"""

from __future__ import annotations

import hashlib
import html
import secrets
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from kernelrl.report.watch.app import bind, create_app, watch_router
from kernelrl.serve.guard import RequestGuard, default_hosts
from kernelrl.serve.http import BodyError, HttpLimits, read_body, uvicorn_config
from kernelrl.serve.tokens import ClientToken, match_token

PREFIX = "/watch"
COOKIE_PREFIX = "kernelrl_watch_"
MAX_FORM_BYTES = 4096
MAX_SESSIONS = 4096
LOGIN_WINDOW_S = 60.0


def cookie_name(request: Request) -> str:
    """The session cookie's name at the server this request reached: one per port."""
    server = request.scope.get("server") or ("", 0)
    return f"{COOKIE_PREFIX}{int(server[1] or 0)}"


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class Sessions:
    """Signed-in browsers: random ids (kept hashed) -> (client, expiry). See the module docstring."""

    def __init__(self, *, session_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.session_s = session_s
        self._clock = clock
        self._live: dict[str, tuple[str, float]] = {}  # insertion order: oldest first

    def issue(self, client: str) -> str:
        now = self._clock()
        for key in [k for k, (_, until) in self._live.items() if until <= now]:
            del self._live[key]
        while len(self._live) >= MAX_SESSIONS:
            del self._live[next(iter(self._live))]
        session_id = secrets.token_urlsafe(32)
        self._live[_digest(session_id)] = (client, now + self.session_s)
        return session_id

    def client(self, session_id: str) -> str | None:
        if not session_id:
            return None
        key = _digest(session_id)
        found = self._live.get(key)
        if found is None:
            return None
        if found[1] <= self._clock():
            del self._live[key]
            return None
        return found[0]

    def end(self, session_id: str) -> None:
        self._live.pop(_digest(session_id), None)

    def __len__(self) -> int:
        return len(self._live)


class LoginLimiter:
    """At most `attempts` failed sign-ins in any minute, for the whole server (on loopback every
    client has the same address, so a per-address limit would be no limit)."""

    def __init__(self, attempts: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.attempts = attempts
        self._clock = clock
        self._failures: deque[float] = deque()

    def retry_after_s(self) -> int | None:
        """Seconds until a sign-in is taken again; None when one is taken now."""
        now = self._clock()
        while self._failures and self._failures[0] <= now - LOGIN_WINDOW_S:
            self._failures.popleft()
        if len(self._failures) < self.attempts:
            return None
        return max(1, int(self._failures[0] + LOGIN_WINDOW_S - now + 0.999))

    def failed(self) -> None:
        self._failures.append(self._clock())


def mount_watch(app: FastAPI, db_path: Path, *, tokens: tuple[ClientToken, ...],
                unauthorized: Callable[[], Exception], count: Callable[[str], None] = lambda _: None,
                session_s: float = 12 * 3600.0, login_attempts: int = 10, body_timeout_s: float = 120.0) -> None:
    """Serve the run pages of `db_path` at /watch/, behind the server's tokens."""
    sessions = Sessions(session_s=session_s)
    limiter = LoginLimiter(login_attempts)

    async def signed_in(request: Request) -> str:
        if not tokens:
            return ""
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        name = match_token(tokens, value.strip()) if scheme.lower() == "bearer" else None
        if name is None:
            name = sessions.client(request.cookies.get(cookie_name(request), ""))
        if name is None:
            raise unauthorized()
        return name

    async def form_field(request: Request, field: str) -> str | JSONResponse:
        try:
            body = await read_body(request, limit=MAX_FORM_BYTES, timeout_s=body_timeout_s)
        except BodyError as e:
            count("too_large" if e.status == 413 else "bad_request")
            return JSONResponse({"error": e.message}, status_code=e.status)
        return (parse_qs(body.decode("utf-8", errors="replace")).get(field) or [""])[0].strip()

    @app.get(PREFIX + "/login", response_class=HTMLResponse)
    async def login_form(failed: int = 0) -> Response:
        return HTMLResponse(_login_page(bool(failed)), headers=_PAGE_HEADERS)

    @app.post(PREFIX + "/login")
    async def login(request: Request) -> Response:
        wait = limiter.retry_after_s()
        if wait is not None:
            count("watch_login_limited")
            return JSONResponse({"error": f"too many failed sign-ins; try again in {wait} s"}, status_code=429,
                                headers={"Retry-After": str(wait)})
        token = await form_field(request, "token")
        if isinstance(token, Response):
            return token
        name = match_token(tokens, token) if tokens else ""
        if name is None:
            limiter.failed()
            count("watch_login_failed")
            return RedirectResponse(PREFIX + "/login?failed=1", status_code=303)
        cookie = cookie_name(request)
        sessions.end(request.cookies.get(cookie, ""))  # rotate: the id held before sign-in ends here
        reply = RedirectResponse(PREFIX + "/", status_code=303)
        reply.set_cookie(cookie, sessions.issue(name), max_age=int(session_s), httponly=True, samesite="strict",
                         path=PREFIX, secure=request.url.scheme == "https")
        return reply

    @app.get(PREFIX + "/logout", response_class=HTMLResponse)
    async def logout_form() -> Response:
        return HTMLResponse(_logout_page(), headers=_PAGE_HEADERS)

    @app.post(PREFIX + "/logout")
    async def logout(request: Request) -> Response:
        cookie = cookie_name(request)
        sessions.end(request.cookies.get(cookie, ""))
        reply = RedirectResponse(PREFIX + "/login", status_code=303)
        reply.delete_cookie(cookie, path=PREFIX, httponly=True, samesite="strict")
        return reply

    app.include_router(watch_router(db_path, dependencies=[Depends(signed_in)]), prefix=PREFIX)


def standalone_app(db_path: str | Path, *, host: str, on_refuse: Callable[[str], None] | None = None) -> FastAPI:
    """`kernelrl watch`'s app: the run pages behind the request guard, every path a page."""
    app = create_app(db_path)
    app.add_middleware(RequestGuard, allowed_hosts=default_hosts(host), on_refuse=on_refuse, pages="")
    return app


def run_standalone(db_path: str | Path, *, host: str = "127.0.0.1", port: int = 8178,
                   announce: Callable[[str], None] = print, limits: HttpLimits | None = None) -> None:
    """Serve `kernelrl watch` until interrupted."""
    import uvicorn

    from kernelrl.serve.config import is_loopback

    sock = bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    announce(f"kernelrl watch: http://{shown}:{bound}/ (database {db_path}, read-only)")
    if not is_loopback(host):
        announce("warning: these pages have no authentication; anyone who reaches this address reads every "
                 "candidate. Behind kernelrl serve's token, or loopback, is the safe way.")
    server = uvicorn.Server(uvicorn_config(standalone_app(db_path, host=host), limits or HttpLimits()))
    server.run(sockets=[sock])


_PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                                            "frame-ancestors 'none'",
                 "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "Cache-Control": "no-store"}
_STYLE = ("<style>body{font:15px system-ui,sans-serif;margin:3em auto;max-width:28em}.bad{color:#b00}"
          "input{width:100%;padding:.4em;margin:.5em 0}</style>")


def _login_page(failed: bool) -> str:
    note = "<p class=bad>That token is not one of this server's.</p>" if failed else ""
    return ("<!doctype html><html><head><meta charset=utf-8><title>kernelrl: sign in</title>"
            f"{_STYLE}</head><body>"
            f"<h1>kernelrl run pages</h1>{note}"
            f'<form method=post action="{html.escape(PREFIX)}/login">'
            "<label>Client token (from the server's token file)"
            "<input type=password name=token autocomplete=off required autofocus></label>"
            "<input type=submit value='Sign in'></form></body></html>")


def _logout_page() -> str:
    return ("<!doctype html><html><head><meta charset=utf-8><title>kernelrl: sign out</title>"
            f"{_STYLE}</head><body><h1>kernelrl run pages</h1>"
            f'<form method=post action="{html.escape(PREFIX)}/logout">'
            "<input type=submit value='Sign out'></form></body></html>")
