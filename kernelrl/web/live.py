"""The run pages (`kernelrl.web`) under the reward server, behind its tokens; and
`kernelrl watch` alone, behind the same request guard, either as its own command
(`run_standalone`) or for the run that writes the database (`LivePage`, a process of its own
started by the run's builder for `--watch.port`).

`kernelrl serve --watch-db runs/x.db` serves the pages of that run database twice: at `/watch/`
to programs (`Authorization: Bearer TOKEN`), and at `/watch/s/KEY/` to a signed-in browser,
which cannot send a bearer token. A person signs in once: `GET /watch/login` is a form that posts
the client's token; a right token starts a session (`Sessions`) of two random secrets, an id and
a key, and redirects to `/watch/s/KEY/`. The id is the cookie (named after the server's port,
`kernelrl_watch_<port>`; `HttpOnly`, `SameSite=Strict`, `Max-Age` its lifetime) and its path is
`/watch/s/KEY`, so the browser sends it there only; the key is in the URL of every page of the
session (links and the pages' script build on the path a page was reached under). A page
under `/watch/s/KEY/` is served only when the cookie sent with it is the id of the live session
issued with KEY (or with a bearer token); the cookie anywhere else, `/watch/` included, is no
session. A browser's page request without one is sent to the sign-in form (303; a script's fetch
gets 401) with the page it asked for (`next`, a path of the run pages and nothing else): the form
says which page, and signing in lands there, under the new session's path. Every page links to
`/watch/s/KEY/logout`, a form that says what signing out does and whose post to `/watch/logout`
ends the session it names, deletes the cookie at its path and returns to the sign-in form, which
says the browser is signed out.

The request guard (`kernelrl.web.guard`) refuses browser requests everywhere else; under
`/watch` it lets through what a page of this very server sends (`Sec-Fetch-Site: same-origin`, an
`Origin` naming the same host and port), and, on the sign-in and sign-out posts only, a form
body (hence the sign-out post at `/watch/logout`, outside the session's path: it names the key
in its body, the cookie is not sent). The sign-in page's `Referrer-Policy` is `same-origin`, so
a browser's post from it names its origin (with `no-referrer` it sends `Origin: null`, which the
guard refuses: a sandboxed page of any site sends the same). A page of another site, or of
another port, is refused, and a rebound host name is refused as before.

Guarantees:
- a session is bound to its server by both halves: browsers send a host's cookies to every port
  of it, but only under the cookie's path, and that path holds the key; a program listening on
  another port of this host receives the cookie only if the browser is sent to that very path
  there, which takes the key; and the cookie replayed here opens no page without its own key
  (not at `/watch/`, not under another session's key). The key never leaves the browser in a
  `Referer` (the pages' policy is `no-referrer`), the server writes no access log, and the id
  and key are compared as SHA-256 digests (`hmac.compare_digest` for the id);
- a session ends after `session_s` (12 h by default), at sign-out, or when the server stops; a
  sign-in always starts a new session with a new id and key (nothing a browser held before is
  upgraded, so a planted cookie is worthless); ids and keys are 256 random bits each, held
  hashed, at most `MAX_SESSIONS` at once (the oldest ends first);
- a session is valid only at the server that issued it (ids live in its memory), and cookies of
  servers on other ports have other names, so signing in to one never signs another out;
- sign-in bodies are read only up to `MAX_FORM_BYTES` (413 past it) and within the body timeout;
  failed sign-ins are counted (`rejected_total{reason="watch_login_failed"}`) and limited: after
  `login_attempts` failures within a minute, every sign-in is answered 429 (`Retry-After`) until
  the oldest of them is a minute old (`watch_login_limited`);
- `kernelrl watch` alone (`run_standalone`) runs behind `RequestGuard` with every path a page:
  a foreign Host (DNS rebinding), another site's page (Origin, Sec-Fetch-Site) and a body that is
  not JSON are refused, and the HTTP limits of `kernelrl.web.http` hold.

Does not guarantee: the key is in the URL, so what sees the browser's URLs sees it (its
history, an address copied and shared, a browser extension); with it, a program on another port
could have the browser sent to the key's path there and take the cookie too. Whoever holds the
key alone can end the session (the sign-out post needs only the key: the guard takes no form
body under the session's path), not use it. A browser's earlier session is not ended by a new
sign-in (its cookie is not sent to `/watch/login`): it lasts until signed out or its lifetime.
Without tokens (a loopback server with no token file, or `kernelrl watch`) the pages are open to
whoever can reach the port, as the API is.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import parse_qs, urlencode

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from kernelrl.web.app import bind, create_app, watch_router
from kernelrl.web.guard import RequestGuard, default_hosts
from kernelrl.web.http import BodyError, HttpLimits, read_body, uvicorn_config
from kernelrl.web.tokens import ClientToken, match_token

PREFIX = "/watch"
SESSION_PREFIX = PREFIX + "/s/{key}"  # a browser's pages: the key is half of its session
COOKIE_PREFIX = "kernelrl_watch_"
MAX_FORM_BYTES = 4096
MAX_SESSIONS = 4096
LOGIN_WINDOW_S = 60.0
_SECRET = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32): 256 bits


def cookie_name(request: Request) -> str:
    """The session cookie's name at the server this request reached: one per port."""
    server = request.scope.get("server") or ("", 0)
    return f"{COOKIE_PREFIX}{int(server[1] or 0)}"


def session_path(key: str) -> str:
    """Where a session's pages live, and the only path its cookie is sent to."""
    return f"{PREFIX}/s/{key}"


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _cookies(request: Request, name: str) -> list[str]:
    """Every value the Cookie header holds under `name` (a browser may send several, one per path)."""
    values = []
    for part in request.headers.get("cookie", "").split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            values.append(value.strip().strip('"'))
    return values


class Sessions:
    """Signed-in browsers: a random id (the cookie) and a random key (the URL path), both kept
    hashed: digest(key) -> (digest(id), client, expiry). See the module docstring."""

    def __init__(self, *, session_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.session_s = session_s
        self._clock = clock
        self._live: dict[str, tuple[str, str, float]] = {}  # insertion order: oldest first

    def issue(self, client: str) -> tuple[str, str]:
        """A new session of `client`: (id, key)."""
        now = self._clock()
        for old in [k for k, (_, _, until) in self._live.items() if until <= now]:
            del self._live[old]
        while len(self._live) >= MAX_SESSIONS:
            del self._live[next(iter(self._live))]
        session_id, key = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        self._live[_digest(key)] = (_digest(session_id), client, now + self.session_s)
        return session_id, key

    def client(self, session_ids: Sequence[str], key: str) -> str | None:
        """The client of the live session issued with `key`, when one of `session_ids` is its id."""
        found = self._live.get(_digest(key)) if key else None
        if found is None:
            return None
        held, client, until = found
        if until <= self._clock():
            del self._live[_digest(key)]
            return None
        matches = [hmac.compare_digest(held, _digest(session_id)) for session_id in session_ids if session_id]
        return client if any(matches) else None

    def end(self, key: str) -> None:
        self._live.pop(_digest(key), None)

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


class SignInFirst(Exception):
    """A browser opened a page without a session: it is sent to the sign-in form."""


def mount_watch(app: FastAPI, db_path: Path, *, tokens: tuple[ClientToken, ...],
                unauthorized: Callable[[], Exception], count: Callable[[str], None] = lambda _: None,
                session_s: float = 12 * 3600.0, login_attempts: int = 10, body_timeout_s: float = 120.0) -> None:
    """Serve the run pages of `db_path` at /watch/ (bearer tokens) and /watch/s/KEY/ (sessions)."""
    sessions = Sessions(session_s=session_s)
    limiter = LoginLimiter(login_attempts)

    def bearer(request: Request) -> str | None:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        return match_token(tokens, value.strip()) if scheme.lower() == "bearer" else None

    def refused(request: Request) -> Exception:
        if request.method in ("GET", "HEAD") and request.headers.get("sec-fetch-mode", "").lower() == "navigate":
            count("unauthorized")
            return SignInFirst()  # a page opened in the browser: the sign-in form; a script's fetch: 401
        return unauthorized()

    async def by_token(request: Request) -> str:
        """/watch/...: a bearer token (programs); a session cookie is not enough here."""
        if not tokens:
            return ""
        name = bearer(request)
        if name is None:
            raise refused(request)
        return name

    async def by_session(request: Request) -> str:
        """/watch/s/KEY/...: the session issued with KEY, its cookie sent along (or a bearer token)."""
        key = str(request.path_params.get("key", ""))
        if not _SECRET.fullmatch(key):
            raise refused(request)
        if not tokens:
            return ""
        name = bearer(request)
        if name is None:
            name = sessions.client(_cookies(request, cookie_name(request)), key)
        if name is None:
            raise refused(request)
        return name

    async def sign_in_first(request: Request, e: Exception) -> Response:
        # the page asked for, relative to a session's root, so signing in lands there
        target = re.sub(r"^/s/[^/]+", "", request.url.path.removeprefix(PREFIX)) or "/"
        return RedirectResponse(PREFIX + "/login?" + urlencode({"next": target}), status_code=303,
                                headers=_PAGE_HEADERS)

    app.add_exception_handler(SignInFirst, sign_in_first)

    async def form_fields(request: Request, fields: Sequence[str]) -> dict[str, str] | JSONResponse:
        try:
            body = await read_body(request, limit=MAX_FORM_BYTES, timeout_s=body_timeout_s)
        except BodyError as e:
            count("too_large" if e.status == 413 else "bad_request")
            return JSONResponse({"error": e.message}, status_code=e.status)
        values = parse_qs(body.decode("utf-8", errors="replace"))
        return {f: (values.get(f) or [""])[0].strip() for f in fields}

    async def form_field(request: Request, field: str) -> str | JSONResponse:
        got = await form_fields(request, (field,))
        return got if isinstance(got, JSONResponse) else got[field]

    @app.get(PREFIX + "/login", response_class=HTMLResponse)
    async def login_form(failed: int = 0, signed_out: int = 0, next: str = "/") -> Response:  # noqa: A002
        return HTMLResponse(_login_page(bool(failed), signed_out=bool(signed_out), target=_next(next)),
                            headers=_PAGE_HEADERS)

    @app.post(PREFIX + "/login")
    async def login(request: Request) -> Response:
        wait = limiter.retry_after_s()
        if wait is not None:
            count("watch_login_limited")
            return JSONResponse({"error": f"too many failed sign-ins; try again in {wait} s"}, status_code=429,
                                headers={"Retry-After": str(wait)})
        fields = await form_fields(request, ("token", "next"))
        if isinstance(fields, Response):
            return fields
        token, target = fields["token"], _next(fields["next"])
        name = match_token(tokens, token) if tokens else ""
        if name is None:
            limiter.failed()
            count("watch_login_failed")
            return RedirectResponse(PREFIX + "/login?" + urlencode({"failed": 1, "next": target}), status_code=303)
        cookie = cookie_name(request)
        session_id, key = sessions.issue(name)  # always a new id and key: nothing held before is upgraded
        reply = RedirectResponse(session_path(key) + target, status_code=303, headers=_PAGE_HEADERS)
        reply.set_cookie(cookie, session_id, max_age=int(session_s), httponly=True, samesite="strict",
                         path=session_path(key), secure=request.url.scheme == "https")
        return reply

    @app.get(SESSION_PREFIX + "/logout", response_class=HTMLResponse)
    async def logout_form(key: str) -> Response:
        if not _SECRET.fullmatch(key):
            return JSONResponse({"error": "not found"}, status_code=404)
        return HTMLResponse(_logout_page(key), headers=_PAGE_HEADERS)

    @app.post(PREFIX + "/logout")
    async def logout(request: Request) -> Response:
        # The form's post comes here, not under the session's path (the guard takes a form body
        # only at /watch/login and /watch/logout), so its cookie is not sent: the key it names ends.
        key = await form_field(request, "key")
        if isinstance(key, Response):
            return key
        reply = RedirectResponse(PREFIX + "/login?signed_out=1", status_code=303, headers=_PAGE_HEADERS)
        if _SECRET.fullmatch(key):
            sessions.end(key)
            reply.delete_cookie(cookie_name(request), path=session_path(key), httponly=True, samesite="strict")
        return reply

    app.include_router(watch_router(db_path, dependencies=[Depends(by_token)]), prefix=PREFIX)
    app.include_router(watch_router(db_path, dependencies=[Depends(by_session)], sign_out="/logout"),
                       prefix=SESSION_PREFIX)


def standalone_app(db_path: str | Path, *, host: str, on_refuse: Callable[[str], None] | None = None) -> FastAPI:
    """`kernelrl watch`'s app: the run pages behind the request guard, every path a page."""
    app = create_app(db_path)
    app.add_middleware(RequestGuard, allowed_hosts=default_hosts(host), on_refuse=on_refuse, pages="")
    return app


def page_url(host: str, port: int) -> str:
    """The pages' address at `host:port` (an IPv6 host in brackets)."""
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def announcement(db_path: str | Path, host: str, port: int, *, name: str = "kernelrl watch") -> list[str]:
    """What serving the pages of `db_path` at `host:port` tells people: the address, and a warning
    when that address is not loopback (the pages have no authentication)."""
    from kernelrl.web.guard import is_loopback

    lines = [f"{name}: {page_url(host, port)} (database {db_path}, read-only)"]
    if not is_loopback(host):
        lines.append("warning: these pages have no authentication; anyone who reaches this address reads every "
                     "candidate. Behind kernelrl serve's token, or loopback, is the safe way.")
    return lines


def run_standalone(db_path: str | Path, *, host: str = "127.0.0.1", port: int = 8178,
                   announce: Callable[[str], None] = print, limits: HttpLimits | None = None) -> None:
    """Serve `kernelrl watch` until interrupted."""
    import uvicorn

    sock = bind(host, port)
    for line in announcement(db_path, host, sock.getsockname()[1]):
        announce(line)
    server = uvicorn.Server(uvicorn_config(standalone_app(db_path, host=host), limits or HttpLimits()))
    server.run(sockets=[sock])


# How long a run's page keeps serving after the run ended: open pages (they poll every 2 s) show
# the run finished, then the page's process ends and says, in the page, how to keep watching.
LINGER_S = 20.0


class LivePage:
    """`kernelrl watch`'s pages of `db_path` for a run that is writing it (the run's builder,
    `kernelrl.run_parts.build_run`, starts one when its `WatchConfig` names a port), served by a
    process of its own (`python -m kernelrl.web.live`, no torch), behind the same guard and
    HTTP limits, until `close`.

    A process, not a thread of the run: rendering a page never holds the run's interpreter, where
    the judge reads its clock around every timed call (a page rendered between a worker's answer
    and the judge's read of it would lengthen that round trip). The address is bound here, so a
    taken port fails before the run starts anything (`OSError`), and the listening socket is
    handed to the page's process; `start` returns once a page is answered there. The page's
    process serves `LINGER_S` seconds more after `close`, or after the run's process is gone (so a
    page open in a browser shows the run finished, not "running" frozen), then ends; a page that
    then finds no server says so, and names `kernelrl watch --db` to keep watching; a Ctrl-C at the
    terminal does not reach it (its own session), so the page shows the run finishing its work. `close` never raises,
    so a run's own error is the one reported.
    """

    def __init__(self, db_path: str | Path, *, host: str = "127.0.0.1", port: int = 0,
                 linger_s: float | None = None) -> None:
        self.db_path = Path(db_path)
        self.host = host
        self.linger_s = LINGER_S if linger_s is None else linger_s
        self._sock = bind(host, port)
        self.port = int(self._sock.getsockname()[1])
        self._process: subprocess.Popen[bytes] | None = None
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 - held for the page process's life, closed by close()

    @property
    def url(self) -> str:
        return page_url(self.host, self.port)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self, timeout_s: float = 30.0) -> LivePage:
        """Start the page's process; `RuntimeError` (with what it printed) if no page is answered
        within `timeout_s`."""
        import urllib.error
        import urllib.request

        fd = self._sock.fileno()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "kernelrl.web.live", "--fd", str(fd), "--host", self.host,
             "--db", str(self.db_path), "--parent", str(os.getpid()), "--linger", str(self.linger_s)],
            pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._errors,
            start_new_session=True)  # a terminal's Ctrl-C is the run's to handle: the page stays until it ends
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(self.url + "api/runs", timeout=1.0):
                    return self
            except (urllib.error.URLError, OSError):
                pass
            if self._process.poll() is not None or time.monotonic() > deadline:
                self._errors.seek(0)
                said = self._errors.read().decode(errors="replace").strip().splitlines()[-3:]
                self.close()
                raise RuntimeError(f"the run page at {self.url} did not start within {timeout_s:g} s"
                                   + (f": {' | '.join(said)}" if said else ""))

    def close(self, timeout_s: float = 10.0) -> None:
        """The run is over: the page's process serves its final state for `linger_s` more seconds
        (0: it stops now), so a page open in a browser shows the run finished, and then ends by
        itself; this process does not wait for it."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            if self.linger_s > 0:
                os.kill(process.pid, signal.SIGUSR1)  # the run ended: serve a little longer, then stop
            else:
                process.terminate()  # uvicorn's own shutdown
                try:
                    process.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self._sock.close()
        self._errors.close()


def _serve_inherited(argv: Sequence[str]) -> int:
    """The page's process (`LivePage`): serve the listening socket it was handed until told to
    stop, or until the process that started it is gone."""
    import argparse

    import uvicorn

    ap = argparse.ArgumentParser(prog="python -m kernelrl.web.live")
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--db", required=True)
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--linger", type=float, default=LINGER_S)
    args = ap.parse_args(argv)
    server = uvicorn.Server(uvicorn_config(standalone_app(args.db, host=args.host), HttpLimits()))
    ended = threading.Event()
    # SIGUSR1: the run ended (`LivePage.close`); so does the run's process being gone
    signal.signal(signal.SIGUSR1, lambda *_: ended.set())

    def exit_after_the_run() -> None:
        while os.getppid() == args.parent and not ended.is_set():
            time.sleep(0.5)
        time.sleep(args.linger)  # open pages poll every 2 s: they fetch the run's final state
        server.should_exit = True

    threading.Thread(target=exit_after_the_run, daemon=True).start()
    server.run(sockets=[socket.socket(fileno=args.fd)])
    return 0


_PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                                            "frame-ancestors 'none'",
                 "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "Cache-Control": "no-store"}
_STYLE = ("<style>body{font:15px system-ui,sans-serif;margin:3em auto;max-width:28em}.bad{color:#b00}"
          "input{width:100%;padding:.4em;margin:.5em 0}</style>")


# A page to land on after signing in: a path of the run pages, nothing else (not another site).
_NEXT = re.compile(r"/[A-Za-z0-9_./%-]{0,500}")


def _next(target: str) -> str:
    """`target` when it is a path of the run pages, else their index ("/")."""
    return target if _NEXT.fullmatch(target) and not target.startswith("//") and ".." not in target else "/"


def _login_page(failed: bool, *, signed_out: bool = False, target: str = "/") -> str:
    notes = []
    if signed_out:
        notes.append("<p>You are signed out: this browser's session has ended.</p>")
    if failed:
        notes.append("<p class=bad>That token is not one of this server's.</p>")
    if target != "/":
        notes.append(f"<p>Sign in to see <code>{html.escape(PREFIX + target)}</code>. Your pages live under the "
                     "address signing in leads to (<code>/watch/s/&hellip;</code>): an address without that part "
                     "asks you to sign in again.</p>")
    return ("<!doctype html><html><head><meta charset=utf-8><title>kernelrl: sign in</title>"
            f"{_STYLE}</head><body>"
            f"<h1>kernelrl run pages</h1>{''.join(notes)}"
            f'<form method=post action="{html.escape(PREFIX)}/login">'
            f'<input type=hidden name=next value="{html.escape(target)}">'
            "<label>Client token (from the server's token file)"
            "<input type=password name=token autocomplete=off required autofocus></label>"
            "<input type=submit value='Sign in'></form></body></html>")


def _logout_page(key: str) -> str:
    return ("<!doctype html><html><head><meta charset=utf-8><title>kernelrl: sign out</title>"
            f"{_STYLE}</head><body><h1>kernelrl run pages</h1>"
            "<p>Sign out of this server's run pages? This browser's session ends; the run and its database "
            "are not touched, and you can sign in again with your token.</p>"
            f'<form method=post action="{html.escape(PREFIX)}/logout">'
            f'<input type=hidden name=key value="{html.escape(key)}">'
            "<input type=submit value='Sign out'></form></body></html>")


if __name__ == "__main__":
    sys.exit(_serve_inherited(sys.argv[1:]))
