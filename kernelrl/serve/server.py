"""The reward server: HTTP requests in, evaluator calls out (FastAPI on uvicorn).

Routes (wire format in `kernelrl.backends.api`):
- `POST /v1/evaluate`: validate, resolve each item's task without running it, store the job
  (`kernelrl.serve.jobs`), answer 202 {job}; 400 bad items, 409 key reused for something else,
  413 body or job too large, 429 queue full with Retry-After;
- `POST /v1/profile`: the same for a profile job (what a reference worker reads about a task);
- `GET /v1/jobs/ID[?wait=S]`: the job's state and results; with `wait`, the answer is held up to
  S seconds (at most 30) until the job has ended, so clients need not poll fast;
- `GET /v1/info`: the server's limits and settings; `GET /metrics`: Prometheus text;
- `/v1/sessions...`: refinement episodes turn by turn (`kernelrl.serve.sessions`);
- `GET /healthz`: liveness, the only route without the bearer token.

Guarantees:
- every route, /healthz included, refuses a foreign Host, a request sent by a web page (Origin)
  and a body that is not JSON (`kernelrl.web.guard`), before anything else is looked at;
- every route but /healthz needs `Authorization: Bearer TOKEN` when the server has tokens (it
  must have them off loopback: `ServeConfig`), one per client (`kernelrl.web.tokens`), compared
  in constant time; tokens are read from a private file and never put in the environment; a job
  or a session is visible only to the client that submitted it (another gets 404);
- a body is refused with 413 as soon as it passes `max_body_bytes` (declared or streamed), and
  before it is parsed when it holds too many items or values, or a string too long to be a
  source (`api.check_body`); bodies are checked and parsed in the thread pool, never on the
  event loop;
- every route that judges (evaluate, profile, a session's turn) only queues a job: the judging happens in the
  dispatcher's threads, bounded by the queue and the lanes, so no request waits on an evaluator
  and no number of slow requests delays the others;
- results and errors returned to clients name no path of the server's machine (`api.scrub_paths`:
  tracebacks and compiler output keep file names only);
- the server's process never runs task or candidate code: tasks sent as source are checked with
  `ast` only, and all judging happens in the backend's evaluators, whose workers are sandboxed;
- one server per database: a lock file beside the database (held until the process ends, even
  by SIGKILL) refuses a second server, so recovery never queues again a job that a live server
  is running; at start, jobs left running by a dead server are queued again;
- the database is opened once (`kernelrl.serve.store.ServerStore`: brought to its schema's
  version, a newer file refused with `StartError`); the job and session stores share its
  connection, and it is closed when the server stops.

Does not terminate TLS: put it behind a TLS proxy (or an SSH tunnel) off a trusted network.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import math
import os
import re
import socket
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from kernelrl.backends.api import (
    Accepted,
    ApiError,
    BadItem,
    EvaluateRequest,
    JobKind,
    JobReply,
    ProfileRequest,
    ServerInfo,
    parse_body,
    resolve_task,
    scrub_paths,
    validation_message,
)
from kernelrl.checks.policy import PolicyName
from kernelrl.judge.isolation.containment import probe
from kernelrl.result import Containment
from kernelrl.reward import RewardModel
from kernelrl.serve.backend import EvalBackend, build_backend
from kernelrl.serve.config import ServeConfig
from kernelrl.serve.dispatch import Dispatcher
from kernelrl.serve.jobs import FINISHED, ItemSpec, JobStore, KeyConflict, QueueFull
from kernelrl.serve.metrics import CONTENT_TYPE, render_metrics
from kernelrl.serve.session_store import SessionStore
from kernelrl.serve.sessions import SessionService, mount_sessions
from kernelrl.serve.store import ServerStore, StoreError
from kernelrl.tasks.task import Size
from kernelrl.web.app import bind
from kernelrl.web.guard import RequestGuard, default_hosts
from kernelrl.web.http import BodyError, limits_of, read_body, uvicorn_config
from kernelrl.web.live import PREFIX as WATCH_PREFIX
from kernelrl.web.live import mount_watch
from kernelrl.web.tokens import ANONYMOUS, ClientToken, TokenFileError, match_token, read_tokens

log = logging.getLogger("kernelrl.serve")

MAX_WAIT_S = 30.0
_JOB_ID = re.compile(r"^[0-9a-f]{32}$")


RETENTION_CHECK_S = 3600.0  # how often finished jobs past `retain_days` are looked for


class StartError(Exception):
    """The server cannot start: the message says why, for a person."""


class CompletionSignal:
    """Wakes the requests waiting on jobs (`?wait=`) whenever a job completes.

    Every completion wakes every waiter, which then re-reads its own job: simple, and cheap for
    the tens of waiters a reward server has. A waiter takes the current event before reading its
    job, so a completion between the read and the wait is never missed.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()

    def current(self) -> asyncio.Event:
        assert self._event is not None, "bind() first"
        return self._event

    def notify(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._fire)
            except RuntimeError:  # the loop closed meanwhile: nobody waits any more
                pass

    def _fire(self) -> None:
        event, self._event = self._event, asyncio.Event()
        if event is not None:
            event.set()


class RewardService:
    """What the routes use: the store, the dispatcher, the clients' tokens and the counters."""

    def __init__(self, config: ServeConfig, *, backend: EvalBackend, tokens: tuple[ClientToken, ...]) -> None:
        self.config = config
        self.backend = backend
        self.tokens = tokens  # empty: no token needed (loopback only)
        try:
            self.database = ServerStore(config.db_path)  # the one file: jobs and sessions, one schema
        except (StoreError, sqlite3.Error) as e:
            raise StartError(f"cannot open the job store {config.db_path}: {e}") from None
        self.store = JobStore(self.database)
        self.sessions = SessionService(config, jobs=self.store, store=SessionStore(self.database),
                                       submit_job=self._store, rewards=RewardModel(config.reward))
        self.signal = CompletionSignal()
        self.dispatcher = Dispatcher(self.store, backend, workers=config.job_concurrency or backend.capacity,
                                     max_attempts=config.max_attempts, on_complete=lambda _: self.signal.notify())
        self.rejected: Counter[str] = Counter()
        self.started_s = time.time()
        self.recovered = 0
        self.purged = 0
        self._retention_stop = threading.Event()
        self._retention: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.signal.bind(loop)
        self.recovered = self.store.recover()
        if self.recovered:
            log.warning("queued again %d job(s) left running by the previous server", self.recovered)
        self.dispatcher.start()
        if self.config.retain_days is not None:
            self.purge_expired()
            self._retention = threading.Thread(target=self._retain, name="kernelrl-retention", daemon=True)
            self._retention.start()

    def purge_expired(self) -> int:
        """Remove the jobs that finished more than `retain_days` ago (see `JobStore.purge`)."""
        assert self.config.retain_days is not None
        cutoff = time.time() - self.config.retain_days * 86400.0
        n = self.store.purge(finished_before_s=cutoff)
        self.purged += n
        if n:
            log.info("removed %d job(s) finished more than %g days ago", n, self.config.retain_days)
        sessions = self.sessions.store.purge(idle_before_s=cutoff)
        if sessions:
            log.info("removed %d session(s) idle for more than %g days", sessions, self.config.retain_days)
        return n

    def _retain(self) -> None:
        assert self.config.retain_days is not None
        every_s = min(RETENTION_CHECK_S, self.config.retain_days * 86400.0 / 4)
        while not self._retention_stop.wait(every_s):
            try:
                self.purge_expired()
            except Exception:  # a store error (disk full, say) must not end the server
                log.exception("removing old jobs failed")

    def stop(self) -> None:
        self._retention_stop.set()
        if self._retention is not None:
            self._retention.join(30)
        self.dispatcher.stop()
        # Closed before the backend is (RewardServer.close): an evaluation still running now can
        # no longer write its result, so one cut short by the closing backend is never stored;
        # its job stays running and is queued again at the next start.
        self.database.close()

    def info(self) -> ServerInfo:
        c = self.config
        return ServerInfo(backend=str(c.backend), devices=list(c.devices), size=c.eval.size, policy=c.eval.policy,
                          max_items_per_job=c.item_limit, max_pending_items=c.max_pending_items,
                          max_body_bytes=c.max_body_bytes, max_source_bytes=c.max_source_bytes)

    def submit(self, body: bytes, owner: str) -> Accepted:
        """Check, parse and store an evaluate job (in a worker thread: bodies are large)."""
        c = self.config
        request = parse_body(EvaluateRequest, body, max_items=c.item_limit, max_string_bytes=c.max_source_bytes)
        if len(request.items) > c.item_limit:
            raise ApiError(413, f"{len(request.items)} items in one job; the limit is {c.item_limit} "
                           "(split the batch)", reason="too_large")
        specs, problems, keys = [], [], set()
        for i, item in enumerate(request.items):
            try:
                for what, text in (("task", item.task), ("candidate", item.candidate)):
                    if len(text.encode()) > c.max_source_bytes:
                        raise BadItem(f"the {what} is {len(text.encode())} bytes; the limit is {c.max_source_bytes}")
                if "\x00" in item.candidate:
                    raise BadItem("the candidate contains a NUL character")
                if item.key is not None:
                    if item.key in keys:
                        raise BadItem(f"key {item.key!r} is used twice in this request")
                    keys.add(item.key)
                specs.append(ItemSpec(task=resolve_task(item.task, item.name), candidate=item.candidate, key=item.key))
            except BadItem as e:
                problems.append(f"item {i}: {e}")
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise ApiError(400, "; ".join(problems[:5]) + more, reason="bad_request")
        return self._store(specs, size=request.size, policy=request.policy, owner=owner, kind=JobKind.EVALUATE)

    def profile(self, body: bytes, owner: str) -> Accepted:
        """Queue a profile job: what a reference worker reads about a task (prompts need it; no
        task code runs here, and no request waits on a worker)."""
        c = self.config
        request = parse_body(ProfileRequest, body, max_items=0, max_string_bytes=c.max_source_bytes)
        if len(request.task.encode()) > c.max_source_bytes:
            raise ApiError(413, f"the task is {len(request.task.encode())} bytes; the limit is {c.max_source_bytes}",
                           reason="too_large")
        try:
            task = resolve_task(request.task, request.name)
        except BadItem as e:
            raise ApiError(400, str(e), reason="bad_request") from None
        return self._store([ItemSpec(task=task, candidate="")], size=request.size, policy=None, owner=owner,
                           kind=JobKind.PROFILE)

    def _store(self, specs: list[ItemSpec], *, size: Size | None, policy: PolicyName | None, owner: str,
               kind: JobKind) -> Accepted:
        c = self.config
        try:
            sub = self.store.submit(specs, size=size or c.eval.size, policy=policy or c.eval.policy,
                                    max_pending=c.max_pending_items, owner=owner, kind=kind)
        except KeyConflict as e:
            raise ApiError(409, str(e), reason="key_conflict") from None
        except QueueFull as e:
            wait = self.retry_after_s(e.pending + e.wanted - e.limit)
            raise ApiError(429, f"{e}; retry in about {wait} s", reason="queue_full",
                           headers={"Retry-After": str(wait)}) from None
        if sub.state not in FINISHED:
            self.dispatcher.notify()
        return Accepted(job=sub.job_id, items=sub.n_items, reused=sub.reused, state=sub.state)

    def retry_after_s(self, excess: int) -> int:
        """Seconds until `excess` evaluations have probably drained, from the recent rate."""
        rate = self.dispatcher.stats().rate_per_s
        if not rate:
            return 5
        return int(min(60, max(1, math.ceil(excess / rate))))

    def metrics(self) -> str:
        now = time.time()
        window = min(3600.0, max(now - self.started_s, 1.0))
        return render_metrics(store=self.store.stats(since=now - window), dispatch=self.dispatcher.stats(),
                              rejected=self.rejected, lanes=len(self.config.devices),
                              queue_limit=self.config.max_pending_items, window_s=window)


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    try:
        return await read_body(request, limit=limit, timeout_s=timeout_s)
    except BodyError as e:
        reason = {413: "too_large", 408: "body_timeout"}.get(e.status, "bad_request")
        raise ApiError(e.status, e.message, reason=reason) from None


def create_app(service: RewardService, *, on_ready: Callable[[], None] | None = None) -> FastAPI:
    """The FastAPI app over a service; the service starts and stops with the app's lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.start(asyncio.get_running_loop())
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            await asyncio.to_thread(service.stop)

    app = FastAPI(title="kernelrl reward server", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        if e.reason:
            service.rejected[e.reason] += 1
        return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def bad_params(request: Request, e: RequestValidationError) -> JSONResponse:
        service.rejected["bad_request"] += 1
        return JSONResponse({"error": validation_message(e.errors())}, status_code=400)

    config = service.config
    allowed = None if "*" in config.allowed_hosts else default_hosts(config.host) | set(config.allowed_hosts)

    def refused(reason: str) -> None:
        service.rejected[reason] += 1

    app.add_middleware(RequestGuard, allowed_hosts=allowed, on_refuse=refused,
                       pages=WATCH_PREFIX if config.watch_db is not None else None)

    async def authorized(request: Request) -> str:
        """The client's name (the owner of the jobs it submits); on the event loop, since a
        thread pool full of other work must not hold up the refusal of a wrong token."""
        if not service.tokens:
            return ANONYMOUS
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        name = match_token(service.tokens, value.strip()) if scheme.lower() == "bearer" else None
        if name is None:
            raise ApiError(401, "missing or wrong bearer token (Authorization: Bearer TOKEN)", reason="unauthorized",
                           headers={"WWW-Authenticate": "Bearer"})
        return name

    auth = [Depends(authorized)]

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/info", dependencies=auth)
    async def info() -> dict[str, Any]:
        return service.info().model_dump(mode="json")

    def accepted(reply: Accepted) -> JSONResponse:
        return JSONResponse(reply.model_dump(mode="json"), status_code=202, headers={"Location": f"/v1/jobs/{reply.job}"})

    @app.post("/v1/evaluate", status_code=202)
    async def evaluate(request: Request, owner: str = Depends(authorized)) -> JSONResponse:
        body = await _read_body(request, config.max_body_bytes, config.body_timeout_s)
        return accepted(await run_in_threadpool(service.submit, body, owner))

    @app.post("/v1/profile", status_code=202)
    async def profile(request: Request, owner: str = Depends(authorized)) -> JSONResponse:
        body = await _read_body(request, config.max_body_bytes, config.body_timeout_s)
        return accepted(await run_in_threadpool(service.profile, body, owner))

    @app.get("/v1/jobs/{job_id}")
    async def job(job_id: str, wait: float = 0.0, owner: str = Depends(authorized)) -> dict[str, Any]:
        if not _JOB_ID.match(job_id):
            raise ApiError(404, f"no job {job_id!r}")
        if not 0.0 <= wait <= MAX_WAIT_S:
            raise ApiError(400, f"wait must be between 0 and {MAX_WAIT_S:g} seconds", reason="bad_request")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            event = service.signal.current()
            # The state alone while waiting (cheap); the results once, when answering.
            state = await run_in_threadpool(lambda: service.store.state(job_id, owner=owner))
            if state is None:
                raise ApiError(404, f"no job {job_id!r}")
            remaining = deadline - loop.time()
            if state in FINISHED or remaining <= 0:
                view = await run_in_threadpool(lambda: service.store.job(job_id, owner=owner))
                if view is None:  # removed meanwhile (retention)
                    raise ApiError(404, f"no job {job_id!r}")
                return JobReply(job=view.job_id, kind=view.kind, state=view.state, items=view.n_items,
                                results=scrub_paths(view.results),
                                error=scrub_paths(view.error)).model_dump(mode="json")
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                pass

    mount_sessions(app, service.sessions, authorized=authorized, wake=service.signal.current, max_wait_s=MAX_WAIT_S,
                   read_body=lambda request: _read_body(request, config.max_body_bytes, config.body_timeout_s))

    if config.watch_db is not None:
        mount_watch(app, config.watch_db, tokens=service.tokens, unauthorized=lambda: ApiError(
            401, f"sign in at {WATCH_PREFIX}/login, or send Authorization: Bearer TOKEN", reason="unauthorized"),
            count=refused, session_s=config.watch_session_hours * 3600.0,
            login_attempts=config.watch_login_attempts, body_timeout_s=config.body_timeout_s)

    @app.get("/metrics", dependencies=auth)
    async def metrics() -> Response:
        text = await run_in_threadpool(service.metrics)
        return Response(text, media_type=CONTENT_TYPE)

    return app


class DbLock:
    """An exclusive lock on `<db>.lock`: one server per database. The kernel drops it when the
    process ends, however it ends."""

    def __init__(self, db_path: Path) -> None:
        self.path = Path(str(db_path) + ".lock")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # held open for the server's life (the lock); private like the database beside it
        self._f = open(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600), "a+")  # noqa: SIM115
        try:
            fcntl.flock(self._f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._f.close()
            raise StartError(f"another server is using {db_path} (lock {self.path} is held)") from None
        self._f.seek(0)
        self._f.truncate()
        self._f.write(f"{os.getpid()}\n")
        self._f.flush()

    def release(self) -> None:
        if not self._f.closed:
            fcntl.flock(self._f, fcntl.LOCK_UN)
            self._f.close()


def bind_socket(host: str, port: int) -> socket.socket:
    """The server's socket from the one binder (`kernelrl.web.app.bind`); a port that
    cannot be had is a `StartError`."""
    try:
        return bind(host, port)
    except OSError as e:
        raise StartError(f"cannot listen on {host}:{port}: {e.strerror}") from None


class RewardServer:
    """One server: the lock on its database, its socket, its backend, its service and uvicorn.

    `run()` serves in this thread until stopped (SIGINT/SIGTERM in the main thread);
    `start_in_thread()` / `stop()` run it in a background thread (tests, benchmarks, notebooks).
    A backend passed in stays the caller's to close; one built here is closed here.
    """

    def __init__(self, config: ServeConfig, *, backend: EvalBackend | None = None,
                 announce: Callable[[str], None] | None = None) -> None:
        self.config = config
        try:
            tokens = read_tokens(config.token_file) if config.token_file is not None else ()
        except TokenFileError as e:
            raise StartError(str(e)) from None
        # Client code is hostile by construction: judged only in fully contained workers, unless asked.
        sandbox = config.eval.sandbox
        found = probe(sandbox.containment, sandbox.uids)
        self.containment = found.level
        if found.level is not Containment.FULL and not config.allow_uncontained:
            raise StartError(f"workers here would be contained only as {found.level.value} ({found.reason}); "
                             "the server judges code clients send, so it refuses to start: install bubblewrap, "
                             "or start with --allow-uncontained to accept the risk")
        self._lock = DbLock(config.db_path)
        self._sock: socket.socket | None = None
        self._own_backend = backend is None
        self.backend: EvalBackend | None = None
        try:
            self._sock = bind_socket(config.host, config.port)
            host, port = self._sock.getsockname()[:2]
            self.port = int(port)
            shown = f"[{host}]" if ":" in host else host
            self.url = f"http://{shown}:{self.port}"
            try:
                self.backend = backend or build_backend(config.backend, config.lane_configs(),
                                                        ray_address=config.ray_address, pool_name=config.ray_pool)
            except Exception as e:  # Ray cannot start, a lane cannot be built: a reason to print, not a trace
                raise StartError(f"cannot start the {config.backend} backend: {e}") from e
            self.service = RewardService(config, backend=self.backend, tokens=tokens)
        except BaseException:
            self.close()
            raise
        who = (f"tokens of {len(tokens)} client(s)" if tokens else
               "no token: any program on this machine may submit (web pages may not)")
        message = (f"kernelrl serve: listening on {self.url} (backend {config.backend}, lanes "
                   f"{','.join(config.devices)}, database {config.db_path}, {who}, containment "
                   f"{self.containment.value})")
        self._server = uvicorn.Server(uvicorn_config(
            create_app(self.service, on_ready=(lambda: announce(message)) if announce else None),
            limits_of(config), log_level=config.log_level, on_refuse=self._refused, lifespan="on",
            timeout_graceful_shutdown=5))
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    def _refused(self, reason: str) -> None:
        self.service.rejected[reason] += 1

    def run(self) -> None:
        try:
            assert self._sock is not None
            self._server.run(sockets=[self._sock])
        finally:
            self.close()

    def start_in_thread(self, timeout_s: float = 30.0) -> RewardServer:
        def target() -> None:
            try:
                self.run()
            except BaseException as e:  # noqa: BLE001 - re-raised in the starting thread
                self._failure = e

        self._thread = threading.Thread(target=target, name="kernelrl-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise StartError(f"the server stopped while starting: {self._failure!r}")
            if time.monotonic() > deadline:
                self.stop()
                raise StartError(f"the server did not start within {timeout_s:g} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)

    def close(self) -> None:
        if self._own_backend and self.backend is not None:
            self.backend.close()
            self.backend = None
        if self._sock is not None:
            self._sock.close()
        self._lock.release()


@contextmanager
def serve_in_thread(config: ServeConfig, *, backend: EvalBackend | None = None) -> Iterator[RewardServer]:
    """A running server in a background thread, stopped on exit."""
    server = RewardServer(config, backend=backend).start_in_thread()
    try:
        yield server
    finally:
        server.stop()


def run_server(config: ServeConfig, *, announce: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted (the `kernelrl serve` command)."""
    RewardServer(config, announce=announce).run()
