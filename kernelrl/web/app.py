"""The run page as a web app: `watch_router(db_path)` for any FastAPI app, `create_app` alone.

Routes, relative to where the router is included:
- `GET /`: the runs in the database (polls `GET /api/runs`; waits for a database not yet made);
- `GET /runs/{id}`: a run's page, refreshed from `GET /api/runs/{id}` every 2 s while it runs;
- `GET /runs/{id}/tasks/{task}`: every candidate of a task with its verdict, evidence, code and
  diffs, and the hack cases with their rules (JSON: `GET /api/runs/{id}/tasks/{task}`);
- `GET /runs/{id}/candidates/{cid}`: one candidate alone;
- `GET /static/{name}`: the page's script, styles and the vendored uPlot (nothing else is served).

Mounting under the reward server, behind its bearer token:

    app.include_router(watch_router(db_path), prefix="/watch", dependencies=[Depends(authorized)])

Links are built from the path the router is reached under, so a prefix needs no setting; a
prefix with path parameters works too (`prefix="/watch/s/{key}"`: each page links under the
key it was reached with, its script's JSON polling included).

Guarantees: the database is opened read-only for each request (`kernelrl.store.snapshot`);
every response carries `Content-Security-Policy` (scripts and styles from this site only, no inline
script, no framing), `X-Content-Type-Options: nosniff` and `Cache-Control: no-store`; a missing
run, task or candidate is 404, a database that is not there yet or not readable 503, each
with a message; JSON holds no NaN or infinity (they become null).

Does not authenticate: alone (`kernelrl watch`, `kernelrl.web.live.run_standalone`, which adds
the reward server's request guard and HTTP limits) it is meant for loopback; off it, put it
behind `kernelrl serve` or a proxy that does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import math
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from kernelrl.result import EvalResult
from kernelrl.store.snapshot import NoDatabase, SnapshotError, snapshot
from kernelrl.web import pages, views
from kernelrl.web.code import PageBudget

STATIC_DIR = Path(__file__).parent / "static"
STATIC_FILES = {  # name -> media type: the only files served
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
    "watch.js": "text/javascript",
    "watch.css": "text/css",
    "LICENSE.uPlot": "text/plain",
}
HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
                                "frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
DEFAULT_PORT = 8178
PAGE_BUDGET_S = 10.0  # a page's time for diffs (kernelrl.web.code.PageBudget)
DISCONNECT_POLL_S = 0.25


def jsonable(obj: Any) -> Any:
    """Dataclasses, enums, tuples and results as JSON values; non-finite floats as null."""
    if isinstance(obj, EvalResult):
        return jsonable(obj.to_dict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return jsonable(obj.value)
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=HEADERS)


def _json(content: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(jsonable(content), status_code=status, headers=HEADERS)


SQLITE_MAX_ID = (1 << 63) - 1


def checked_id(value: int, what: str) -> int:
    """An id from a URL, or NotFound (a 404) when no row can have it (negative, or past SQLite's
    integers: binding it would raise OverflowError)."""
    if not 0 <= value <= SQLITE_MAX_ID:
        raise views.NotFound(f"no {what} {value}")
    return value


async def rendered(request: Request, build: Callable[[PageBudget], Response],
                   budget_s: float = PAGE_BUDGET_S) -> Response:
    """`build(budget)` in a worker thread; when the client leaves meanwhile, the budget is
    cancelled so the page stops computing (its answer goes nowhere)."""
    budget = PageBudget(budget_s)
    job = asyncio.ensure_future(asyncio.to_thread(build, budget))
    while True:
        done, _ = await asyncio.wait({job}, timeout=DISCONNECT_POLL_S)
        if done:
            return job.result()
        if not budget.cancel.is_set() and await request.is_disconnected():
            budget.cancel.set()


def _stored_after(path: Path, run_id: int) -> bool:
    """A run with a larger id is stored: `run_id` was skipped or removed, it will not start."""
    try:
        with snapshot(path) as snap:
            return any(r.id > run_id for r in views.run_list(snap))
    except SnapshotError:
        return False


def watch_router(db_path: str | Path, *, dependencies: Sequence[Any] | None = None,
                 clock: Callable[[], float] = time.time, sign_out: str = "") -> APIRouter:
    """The pages and JSON endpoints over one database file (read-only); `sign_out`, a path
    under the router's own (e.g. "/logout"), adds a sign-out link to every page."""
    path = Path(db_path)
    shown = str(path)
    router = APIRouter(dependencies=list(dependencies or []))
    own_params: set[str] = set()  # the routes' own path parameters (filled in below); the rest are the prefix's

    def links(request: Request) -> pages.Links:
        prefix = {k: quote(str(v), safe="") for k, v in request.path_params.items() if k not in own_params}
        base = str(request.url_for("watch_index", **prefix).path).rstrip("/")
        return pages.Links(base=base, sign_out=base + sign_out if sign_out else "")

    def failure(request: Request, e: Exception, *, as_json: bool) -> Response:
        status = 404 if isinstance(e, views.NotFound) else 503
        title = "not found" if status == 404 else "database not readable"
        if isinstance(e, NoDatabase):
            title = "waiting for the run"
        if as_json:
            return _json({"error": str(e)}, status)
        return _html(pages.message_page(title, str(e), links(request), status_line=shown), status)

    @router.get("/", name="watch_index", response_class=HTMLResponse)
    def index(request: Request) -> Response:
        try:
            with snapshot(path) as snap:
                return _html(pages.index_page(views.run_list(snap), links(request), db_path=shown))
        except NoDatabase as e:
            return _html(pages.index_page([], links(request), db_path=shown, waiting=str(e)))
        except SnapshotError as e:
            return failure(request, e, as_json=False)

    @router.get("/api/runs", name="watch_runs_api")
    def runs_api(request: Request) -> Response:
        try:
            with snapshot(path) as snap:
                runs = views.run_list(snap)
        except NoDatabase as e:
            return _json({"runs": [], "waiting": str(e), "display": pages.runs_display([], links(request))})
        except SnapshotError as e:
            return failure(request, e, as_json=True)
        return _json({"runs": runs, "display": pages.runs_display(runs, links(request))})

    @router.get("/runs/latest", name="watch_latest")
    def latest(request: Request) -> Response:
        try:
            with snapshot(path) as snap:
                runs = views.run_list(snap)
        except SnapshotError as e:
            return failure(request, e, as_json=False)
        target = links(request).run(runs[0].id) if runs else links(request).index()
        return RedirectResponse(target, status_code=307, headers=HEADERS)

    @router.get("/runs/{run_id}", name="watch_run", response_class=HTMLResponse)
    def run_page(request: Request, run_id: int) -> Response:
        try:
            with snapshot(path) as snap:
                view = views.run_view(snap, checked_id(run_id, "run"), now=clock())
        except views.NotFound as e:
            if not _stored_after(path, run_id):  # a run not started yet: wait for it, not a dead end
                return _html(pages.waiting_page(f"run {run_id}", f"No run {run_id} in this database yet; this page "
                                                "reloads until it starts.", links(request), status_line=shown), 404)
            return failure(request, e, as_json=False)
        except SnapshotError as e:
            return failure(request, e, as_json=False)
        return _html(pages.run_page(view, links(request), db_path=shown))

    @router.get("/api/runs/{run_id}", name="watch_run_api")
    def run_api(request: Request, run_id: int) -> Response:
        try:
            with snapshot(path) as snap:
                view = views.run_view(snap, checked_id(run_id, "run"), now=clock())
        except (SnapshotError, views.NotFound) as e:
            return failure(request, e, as_json=True)
        return _json({"view": view, "display": pages.run_display(view, links(request))})

    @router.get("/runs/{run_id}/tasks/{task:path}", name="watch_task", response_class=HTMLResponse)
    async def task_page(request: Request, run_id: int, task: str) -> Response:
        def build(budget: PageBudget) -> Response:
            try:
                with snapshot(path) as snap:
                    view = views.task_view(snap, checked_id(run_id, "run"), task)
            except (SnapshotError, views.NotFound) as e:
                return failure(request, e, as_json=False)
            return _html(pages.task_page(view, links(request), budget=budget))

        return await rendered(request, build)

    @router.get("/api/runs/{run_id}/tasks/{task:path}", name="watch_task_api")
    def task_api(request: Request, run_id: int, task: str) -> Response:
        try:
            with snapshot(path) as snap:
                view = views.task_view(snap, checked_id(run_id, "run"), task)
        except (SnapshotError, views.NotFound) as e:
            return failure(request, e, as_json=True)
        return _json({"view": view})

    @router.get("/runs/{run_id}/candidates/{candidate_id}", name="watch_candidate", response_class=HTMLResponse)
    async def candidate_page(request: Request, run_id: int, candidate_id: int) -> Response:
        def build(budget: PageBudget) -> Response:
            try:
                with snapshot(path) as snap:
                    d, reference, parent = views.candidate_view(snap, checked_id(candidate_id, "candidate"))
            except (SnapshotError, views.NotFound) as e:
                return failure(request, e, as_json=False)
            return _html(pages.candidate_page(d, reference, parent, links(request)))

        return await rendered(request, build)

    @router.get("/static/{name}", name="watch_static")
    def static(name: str) -> Response:
        media = STATIC_FILES.get(name)
        if media is None:
            return Response("not found", status_code=404, media_type="text/plain", headers=HEADERS)
        return Response((STATIC_DIR / name).read_bytes(), media_type=media,
                        headers={**HEADERS, "Cache-Control": "max-age=3600"})

    for route in router.routes:
        own_params.update(getattr(route, "param_convertors", {}))
    return router


def create_app(db_path: str | Path) -> FastAPI:
    """The standalone app of `kernelrl watch`."""
    app = FastAPI(title="kernelrl watch", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(watch_router(db_path))
    return app


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port), so the address can be announced before serving.

    The one binder of every server kernelrl runs (the run page, `kernelrl watch`, the reward
    server) and of the preflight checks that a port is free, so a check tests what will listen:
    a restarted server takes its port back at once (SO_REUSEADDR: the old connections may linger
    in TIME_WAIT), a backlog of 2048 for a trainer's bursts of requests, non-blocking as the
    event loop serving it wants it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock
