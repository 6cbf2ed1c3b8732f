"""The run pages (`kernelrl.report.watch`) under the reward server, behind its tokens.

`kernelrl serve --watch-db runs/x.db` serves the pages of that run database at `/watch/`. A
browser cannot send a bearer token, so a person signs in once: `GET /watch/login` is a form that
posts the client's token; a right token sets a session cookie (`HttpOnly`, `SameSite=Strict`,
path `/watch`) holding the client's name and an HMAC of it under a key drawn when the server
started, and redirects to the pages. Every `/watch` route accepts either the cookie or
`Authorization: Bearer TOKEN` (programs).

The request guard (`kernelrl.serve.guard`) refuses browser requests everywhere else; under
`/watch` it lets through what a page of this very server sends (`Sec-Fetch-Site: same-origin`, an
`Origin` naming the same host), and, on `POST /watch/login` only, a form body. A page of another
site is still refused (its `Sec-Fetch-Site` or `Origin` says so), and a rebound host name is
refused as before.

Guarantees: a session cookie is worth nothing to another server or after a restart (the key is
per process); the pages only read the database; without tokens (a loopback server with no
token file) the pages are open to whoever can reach the port, as the API is.

Does not expire sessions before the server stops, and does not log anyone out.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import secrets
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from kernelrl.report.watch.app import watch_router
from kernelrl.serve.tokens import ClientToken, match_token

PREFIX = "/watch"
COOKIE = "kernelrl_watch"
_MAX_FORM_BYTES = 4096


class Sessions:
    """Signed session values for signed-in clients (see the module docstring)."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def issue(self, client: str) -> str:
        return f"{client}:{self._sign(client)}"

    def client(self, value: str) -> str | None:
        name, sep, signature = value.rpartition(":")
        if not sep or not name or not hmac.compare_digest(signature, self._sign(name)):
            return None
        return name

    def _sign(self, client: str) -> str:
        return hmac.new(self._key, client.encode(), hashlib.sha256).hexdigest()


def mount_watch(app: FastAPI, db_path: Path, *, tokens: tuple[ClientToken, ...],
                unauthorized: Callable[[], Exception]) -> None:
    """Serve the run pages of `db_path` at /watch/, behind the server's tokens."""
    sessions = Sessions()

    async def signed_in(request: Request) -> str:
        if not tokens:
            return ""
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        name = match_token(tokens, value.strip()) if scheme.lower() == "bearer" else None
        if name is None:
            name = sessions.client(request.cookies.get(COOKIE, ""))
        if name is None:
            raise unauthorized()
        return name

    @app.get(PREFIX + "/login", response_class=HTMLResponse)
    async def login_form(failed: int = 0) -> Response:
        return HTMLResponse(_login_page(bool(failed)), headers=_PAGE_HEADERS)

    @app.post(PREFIX + "/login")
    async def login(request: Request) -> Response:
        body = (await request.body())[:_MAX_FORM_BYTES].decode("utf-8", errors="replace")
        token = (parse_qs(body).get("token") or [""])[0].strip()
        name = match_token(tokens, token) if tokens else ""
        if name is None:
            return RedirectResponse(PREFIX + "/login?failed=1", status_code=303)
        reply = RedirectResponse(PREFIX + "/", status_code=303)
        reply.set_cookie(COOKIE, sessions.issue(name), httponly=True, samesite="strict", path=PREFIX,
                         secure=request.url.scheme == "https")
        return reply

    app.include_router(watch_router(db_path, dependencies=[Depends(signed_in)]), prefix=PREFIX)


_PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                                            "frame-ancestors 'none'",
                 "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def _login_page(failed: bool) -> str:
    note = "<p class=bad>That token is not one of this server's.</p>" if failed else ""
    return ("<!doctype html><html><head><meta charset=utf-8><title>kernelrl: sign in</title>"
            "<style>body{font:15px system-ui,sans-serif;margin:3em auto;max-width:28em}.bad{color:#b00}"
            "input{width:100%;padding:.4em;margin:.5em 0}</style></head><body>"
            f"<h1>kernelrl run pages</h1>{note}"
            f'<form method=post action="{html.escape(PREFIX)}/login">'
            "<label>Client token (from the server's token file)"
            "<input type=password name=token autocomplete=off required autofocus></label>"
            "<input type=submit value='Sign in'></form></body></html>")
