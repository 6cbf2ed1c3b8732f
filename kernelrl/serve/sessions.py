"""Refinement sessions over HTTP: a client's multi-turn episode on one task, turn by turn.

The same episode `kernelrl optimize --turns` runs (`kernelrl.episodes.episode`), served to RL
frameworks that drive the model themselves: verl's agent loop (an interaction starts, answers
each assistant turn with feedback text, a turn score and whether to stop, and is finalised) and
OpenEnv's reset/step/state. Routes (wire format in `kernelrl.backends.api`):

- `POST /v1/sessions` {task, name?, turns, size?, policy?, gamma?, history_tokens?, key?}: 201
  with the session; queues a profile job (what the prompt's shapes come from) like
  `/v1/profile`, under a per-client key, so each task's profile is read once;
- `GET /v1/sessions/ID/prompt[?wait=S]`: the next turn's prompt: the base prompt the server
  builds (`kernelrl.episodes.prompt.build_prompt`, no code database, with the task's profile when
  its reference worker could read it) and the episode's earlier answers and verdicts
  (`Episode.prompt`, within the history budget); `waiting` while the profile or the previous
  turn's verdict is not known yet;
- `POST /v1/sessions/ID/turns[?wait=S]` {answer | candidate, turn?}: the next turn. Its code is
  judged by an evaluate job through the same bounded queue as every job (429 when full); the
  reply is 202 with the job while it is judged, 200 with the verdict text, status, reward
  (`kernelrl.reward.RewardModel`), whether the episode is done and the next prompt once judged.
  An answer without a complete code block is a turn too (judged at once: no code);
- `GET /v1/sessions/ID/turns/N[?wait=S]`: one turn; `GET /v1/sessions/ID`: every turn, the
  rewards and the discounted returns (`discounted_returns`, the session's gamma);
- `DELETE /v1/sessions/ID`: close it (no more turns; it stays readable until retention removes it).

Guarantees:
- the same token rule as jobs: a session is visible only to the client that created it (another
  client gets 404), and every route but /healthz needs the token when the server has tokens; the
  request guard applies as on every route; bodies are bounded like job bodies (a source or an
  answer at most `max_source_bytes`); a client has at most `max_sessions_per_client` open
  sessions (429 past that);
- durable: sessions and turns are stored in the server's database before the answer
  (`kernelrl.serve.session_store`); a turn's evaluation is a job with an idempotency key made of
  the session, the turn and the code's hash, so a server killed at any point and started again
  judges each turn once and keeps every verdict already given;
- a turn's verdict and reward are recorded exactly once (under one lock, only while pending), the
  first time anyone reads the turn after its job is done; the reward is the client's own
  `RewardModel` (its smoothing window holds that client's turns only, so no client moves the
  bound another's rewards are clipped to; it is this process's, so rewards recorded before a
  restart are kept as they were, and the window starts empty after it);
- the verdict text is `kernelrl.episodes.feedback`'s: never the worker's log, seeds, input values
  or the harness's paths; the full result is the job's (`GET /v1/jobs/ID`, same client only).

Does not measure torch.compile baselines (verdicts give the speedup against eager), keep a code
database (the base prompt shows no earlier versions), or cancel a job when its session closes.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from kernelrl.backends.api import (
    MAX_TURNS,
    Accepted,
    ApiError,
    BadItem,
    JobKind,
    JobState,
    PromptReply,
    SessionCreate,
    SessionReply,
    TurnReply,
    TurnState,
    TurnSubmit,
    parse_body,
    resolve_task,
    scrub_paths,
)
from kernelrl.candidate import extract_code
from kernelrl.episodes.episode import DEFAULT_GAMMA, EpisodeConfig
from kernelrl.episodes.feedback import feedback
from kernelrl.result import EvalResult
from kernelrl.reward import RewardModel
from kernelrl.serve.config import ServeConfig
from kernelrl.serve.jobs import FINISHED, ItemSpec, JobStore
from kernelrl.serve.session_replies import SessionReplies
from kernelrl.serve.session_store import SessionLimit, SessionRecord, SessionStore, TurnRecord, TurnRefused

SubmitJob = Callable[..., Accepted]  # RewardService's: (specs, *, size, policy, owner, kind) -> Accepted
T = TypeVar("T")
_SESSION_ID = re.compile(r"^[0-9a-f]{32}$")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class SessionService:
    """What the session routes call (in worker threads: every method reads or writes SQLite)."""

    def __init__(self, config: ServeConfig, *, jobs: JobStore, store: SessionStore, submit_job: SubmitJob,
                 rewards: RewardModel) -> None:
        self.config = config
        self.jobs = jobs
        self.store = store
        self.submit_job = submit_job
        self.replies = SessionReplies(config, jobs=jobs, store=store)
        # One reward model per client: its clip window is the client's own, so one client's turns
        # never move the bound another client's rewards are clipped to.
        self._reward_config = rewards.config
        self._rewards: dict[str, RewardModel] = {}
        # One lock over every change of a turn: a turn is submitted, resubmitted or scored by
        # one thread at a time, so its job is stored once and its reward drawn once.
        self._lock = threading.RLock()

    # -- routes ---------------------------------------------------------------------------------

    def create(self, body: bytes, owner: str) -> SessionReply:
        c = self.config
        req = parse_body(SessionCreate, body, max_items=1, max_string_bytes=c.max_source_bytes)
        if len(req.task.encode()) > c.max_source_bytes:
            raise ApiError(413, f"the task is {len(req.task.encode())} bytes; the limit is {c.max_source_bytes}",
                           reason="too_large")
        try:
            task = resolve_task(req.task, req.name)
        except BadItem as e:
            raise ApiError(400, str(e), reason="bad_request") from None
        size, policy = req.size or c.eval.size, req.policy or c.eval.policy
        episode = EpisodeConfig(turns=req.turns, gamma=DEFAULT_GAMMA if req.gamma is None else req.gamma,
                                **({"history_tokens": req.history_tokens} if req.history_tokens else {}))
        if req.key is not None:
            found = self.store.find_key(owner, req.key)
            if found is not None:
                if (found.task.source, found.size, found.policy, found.episode) != (task.source, size, policy, episode):
                    raise ApiError(409, f"key {req.key!r} was already used for another session", reason="key_conflict")
                return self.replies.reply(found)
        # The profile job is keyed by what it reads, so every session on the task shares one.
        profile_key = f"kernelrl-session-profile/{_sha(task.source)[:32]}/{size}/{policy}"
        profile = self.submit_job([ItemSpec(task=task, candidate="", key=profile_key)], size=size, policy=policy,
                                  owner=owner, kind=JobKind.PROFILE)
        try:
            record = self.store.create(owner=owner, task=task, size=size, policy=policy, episode=episode,
                                       profile_job=profile.job, key=req.key, max_open=c.max_sessions_per_client)
        except SessionLimit as e:
            raise ApiError(429, str(e), reason="too_many_sessions", headers={"Retry-After": "5"}) from None
        return self.replies.reply(record)

    def read(self, session_id: str, owner: str) -> SessionReply:
        return self.replies.reply(self._settle(self._get(session_id, owner)))

    def close(self, session_id: str, owner: str) -> SessionReply:
        if not _SESSION_ID.match(session_id) or not self.store.close_session(session_id, owner=owner):
            raise ApiError(404, f"no session {session_id!r}")
        return self.read(session_id, owner)

    def prompt(self, session_id: str, owner: str) -> PromptReply:
        rec = self._settle(self._get(session_id, owner))
        if rec.closed_s is not None:
            return PromptReply(session=rec.id, turn=None, state="closed")
        if rec.done:
            return PromptReply(session=rec.id, turn=None, state="done")
        built = self.replies.base_prompt(rec)
        if built is None or rec.pending is not None:
            return PromptReply(session=rec.id, turn=rec.next_turn, state="waiting")
        base, profile_error = built
        return PromptReply(session=rec.id, turn=rec.next_turn, state="ready", prompt=self.replies.episode(rec).prompt(base),
                           profile_error=profile_error)

    def submit(self, session_id: str, body: bytes, owner: str) -> TurnReply:
        c = self.config
        req = parse_body(TurnSubmit, body, max_items=1, max_string_bytes=c.max_source_bytes)
        text = req.answer if req.answer is not None else req.candidate
        assert text is not None  # TurnSubmit holds exactly one
        if len(text.encode()) > c.max_source_bytes:
            raise ApiError(413, f"the answer is {len(text.encode())} bytes; the limit is {c.max_source_bytes}",
                           reason="too_large")
        code = req.candidate if req.candidate is not None else extract_code(text)
        if code is not None and "\x00" in code:
            raise ApiError(400, "the candidate contains a NUL character", reason="bad_request")
        self._settle(self._get(session_id, owner))
        with self._lock:
            rec = self._get(session_id, owner)
            number = req.turn or rec.next_turn
            stored = next((t for t in rec.turns if t.number == number and t.state is not TurnState.FAILED), None)
            if stored is not None:  # a retry of a turn already taken returns it; another answer is refused
                if (stored.answer, stored.code) != (req.answer, code):
                    raise ApiError(409, f"turn {number} was already taken with another answer", reason="turn_conflict")
                return self.turn(session_id, number, owner)
            key = f"kernelrl-session/{rec.id}/{number}/{_sha(code)[:32]}" if code is not None else None
            try:
                turn = self.store.add_turn(rec.seq, number, answer=req.answer, code=code, key=key,
                                           **({} if code is not None else self._no_code(req.answer, owner)))
            except TurnRefused as e:
                raise ApiError(409, str(e), reason="turn_conflict") from None
            if code is not None:
                try:
                    job = self._judge(rec, code, key)
                except ApiError:  # the queue is full: the turn was not taken
                    self.store.drop_pending(rec.seq, number)
                    raise
                self.store.set_job(rec.seq, number, job)
        return self.turn(session_id, turn.number, owner)

    def turn(self, session_id: str, number: int, owner: str) -> TurnReply:
        rec = self._settle(self._get(session_id, owner))
        turn = next((t for t in rec.turns if t.number == number), None)
        if turn is None:
            raise ApiError(404, f"session {session_id} has no turn {number}")
        return self.replies.turn_reply(rec, turn)

    # -- turns ----------------------------------------------------------------------------------

    def _get(self, session_id: str, owner: str) -> SessionRecord:
        rec = self.store.get(session_id, owner=owner) if _SESSION_ID.match(session_id) else None
        if rec is None:
            raise ApiError(404, f"no session {session_id!r}")
        return rec

    def _judge(self, rec: SessionRecord, code: str, key: str | None) -> str:
        accepted = self.submit_job([ItemSpec(task=rec.task, candidate=code, key=key)], size=rec.size,
                                   policy=rec.policy, owner=rec.owner, kind=JobKind.EVALUATE)
        return accepted.job

    def rewards(self, owner: str) -> RewardModel:
        """The client's own reward model (see `__init__`)."""
        with self._lock:
            return self._rewards.setdefault(owner, RewardModel(self._reward_config))

    def _no_code(self, answer: str | None, owner: str) -> dict[str, Any]:
        return {"verdict": feedback(None), "reward": self.rewards(owner).score(None, answer=answer)}

    def _settle(self, rec: SessionRecord) -> SessionRecord:
        """Record the verdict of the pending turn when its job is done (see the module docstring)."""
        if rec.pending is None:
            return rec
        with self._lock:
            fresh = self.store.get(rec.id, owner=rec.owner)
            pending = fresh.pending if fresh is not None else None
            if fresh is None or pending is None:
                return fresh or rec
            if pending.job is None:  # stored just before the server died: submitted again, same key
                try:
                    self.store.set_job(fresh.seq, pending.number, self._judge(fresh, pending.code or "", pending.key))
                except ApiError:  # the queue is full: it stays pending, and is submitted at a later read
                    return fresh
            else:
                self._record_verdict(fresh, pending)
            return self.store.get(rec.id, owner=rec.owner) or fresh

    def _record_verdict(self, rec: SessionRecord, turn: TurnRecord) -> None:
        assert turn.job is not None
        view = self.jobs.job(turn.job, owner=rec.owner)
        if view is None:
            self.store.finish_turn(rec.seq, turn.number, error="its evaluation job was removed; submit the turn again")
        elif view.state is JobState.FAILED:
            self.store.finish_turn(rec.seq, turn.number, error=f"its evaluation failed on the server: {view.error}; "
                                                               "submit the turn again")
        elif view.state in FINISHED and view.results and view.results[0] is not None:
            result = EvalResult.from_dict(view.results[0])
            reward = self.rewards(rec.owner).score(result, answer=turn.answer, level=rec.task.level)
            self.store.finish_turn(rec.seq, turn.number, result=result, verdict=feedback(result), reward=reward)


def mount_sessions(app: FastAPI, service: SessionService, *, authorized: Callable[..., Awaitable[str]],
                   read_body: Callable[[Request], Awaitable[bytes]], wake: Callable[[], asyncio.Event],
                   max_wait_s: float) -> None:
    """Add the session routes to the app (`authorized`: the token dependency, which answers the
    client's name; `wake`: the event set when any job completes)."""
    def check_wait(wait: float) -> None:
        if not 0.0 <= wait <= max_wait_s:
            raise ApiError(400, f"wait must be between 0 and {max_wait_s:g} seconds", reason="bad_request")

    async def waited(read: Callable[[], T], ready: Callable[[T], bool], wait: float) -> T:
        """`read()` until `ready` or `wait` seconds pass, re-read whenever a job completes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            event = wake()  # taken before the read, so a completion in between is not missed
            out = await run_in_threadpool(read)
            remaining = deadline - loop.time()
            if ready(out) or remaining <= 0:
                return out
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                pass

    def answer(reply: BaseModel, status: int = 200, **headers: str) -> JSONResponse:
        return JSONResponse(_scrub_errors(reply.model_dump(mode="json")), status_code=status, headers=headers or None)

    @app.post("/v1/sessions", status_code=201)
    async def create(request: Request, owner: str = Depends(authorized)) -> JSONResponse:
        body = await read_body(request)
        reply = await run_in_threadpool(service.create, body, owner)
        return answer(reply, 201, Location=f"/v1/sessions/{reply.session}")

    @app.get("/v1/sessions/{session_id}")
    async def read(session_id: str, owner: str = Depends(authorized)) -> JSONResponse:
        return answer(await run_in_threadpool(service.read, session_id, owner))

    @app.delete("/v1/sessions/{session_id}")
    async def close(session_id: str, owner: str = Depends(authorized)) -> JSONResponse:
        return answer(await run_in_threadpool(service.close, session_id, owner))

    @app.get("/v1/sessions/{session_id}/prompt")
    async def prompt(session_id: str, wait: float = 0.0, owner: str = Depends(authorized)) -> JSONResponse:
        check_wait(wait)
        reply = await waited(lambda: service.prompt(session_id, owner), lambda r: r.state != "waiting", wait)
        return answer(reply)

    @app.post("/v1/sessions/{session_id}/turns")
    async def submit(session_id: str, request: Request, wait: float = 0.0,
                     owner: str = Depends(authorized)) -> JSONResponse:
        check_wait(wait)
        body = await read_body(request)
        first = await run_in_threadpool(service.submit, session_id, body, owner)
        reply = first if first.state is not TurnState.PENDING else await waited(
            lambda: service.turn(session_id, first.turn, owner), lambda r: r.state is not TurnState.PENDING, wait)
        location = f"/v1/sessions/{session_id}/turns/{reply.turn}"
        return answer(reply, 202 if reply.state is TurnState.PENDING else 200, Location=location)

    @app.get("/v1/sessions/{session_id}/turns/{number}")
    async def turn(session_id: str, number: int, wait: float = 0.0, owner: str = Depends(authorized)) -> JSONResponse:
        check_wait(wait)
        if not 1 <= number <= MAX_TURNS:  # no such turn (and no integer SQLite could not bind)
            raise ApiError(404, f"no turn {number} in session {session_id[:40]!r}")
        reply = await waited(lambda: service.turn(session_id, number, owner),
                             lambda r: r.state is not TurnState.PENDING, wait)
        return answer(reply)


def _scrub_errors(reply: object) -> object:
    """A reply with the server's paths cut from its error texts (prompts and verdicts are left
    as they are: the feedback already shows no path)."""
    if isinstance(reply, list):
        return [_scrub_errors(v) for v in reply]
    if isinstance(reply, dict):
        return {k: scrub_paths(v) if k in ("error", "profile_error") else _scrub_errors(v) for k, v in reply.items()}
    return reply
