"""The reward server's Python client: submit batches, wait for verdicts, retry what is transient.

`RewardClient(url, token_file=...)` has `evaluate_batch(items) -> list[EvalResult]` with
`Evaluator.evaluate_batch`'s signature, so anything that takes an evaluator (the TRL reward
function, the search loop) takes the client.

Guarantees:
- transient failures are retried (`kernelrl.backends.transport`: exponential backoff with full
  jitter, connection errors, timeouts and 5xx up to `retries` times, 429 until `queue_wait_s`,
  Retry-After honoured);
- a retried submission never evaluates twice: every item carries an idempotency key (the
  caller's, or one made per call), so a job the server stored before the connection broke is
  answered from the store;
- the server dying and coming back (same database) costs nothing: jobs are persisted, and
  waiting retries until it answers again (within `retries` with backoff, about a minute with
  the defaults);
- other client errors (400, 401, 403, 404, 409, 413, 415) raise `ServeError` at once with the
  server's message; results come back in the order given;
- every call ends: `evaluate_batch` and `profile` give up after `timeout_s` (an hour by
  default; `math.inf` waits for ever), each HTTP request after `request_timeout_s` plus its long
  poll, and a job the server could not finish (`failed`) raises `ServeError` with its reason.

Refinement sessions (`kernelrl.serve.sessions`): `open_session(task, turns=3)` returns a
`RemoteSession` (`prompt()`, `step(answer)` -> the turn's verdict, reward, done and next prompt,
`state()`, `close()`), on `create_session`, `session_prompt`, `submit_turn`, `session` and
`close_session`. A retried create carries the same key and a retried turn its number, so
neither is taken twice.

Does not hold results across processes: a caller that must survive its own crash passes its
own keys (`(task, candidate, key)` items) and submits again.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernelrl.backends.api import (
    Accepted,
    EvaluateRequest,
    ItemIn,
    JobKind,
    JobReply,
    JobState,
    ProfileOutcome,
    ProfileRequest,
    PromptReply,
    ServerInfo,
    SessionCreate,
    SessionReply,
    TurnReply,
    TurnState,
    TurnSubmit,
    wire_item,
)
from kernelrl.backends.transport import DEFAULT_TIMEOUT_S as DEFAULT_TIMEOUT_S
from kernelrl.backends.transport import ClientConfig as ClientConfig
from kernelrl.backends.transport import ServeError as ServeError
from kernelrl.backends.transport import Transport
from kernelrl.candidate import Candidate
from kernelrl.checks.policy import PolicyName
from kernelrl.judge.harness.profile import TaskProfile
from kernelrl.result import EvalResult
from kernelrl.tasks.task import Size, Task, TaskError
from kernelrl.web.tokens import client_token

# Room left in a body for JSON quoting and the envelope when splitting a batch by size.
_BODY_MARGIN = 0.8


class RewardClient:
    """A client of one reward server. Thread-safe: several threads may share it."""

    def __init__(self, url: str, *, token: str | None = None, token_file: str | Path | None = None,
                 config: ClientConfig | None = None) -> None:
        if token is not None and token_file is not None:
            raise ValueError("give a token or a token file, not both")
        if token_file is not None:
            token = client_token(token_file)  # TokenFileError (a ValueError) with the reason
        self.url = url.rstrip("/")
        self.config = config or ClientConfig()
        self.transport = Transport(self.url, token=token, config=self.config)
        self._info: ServerInfo | None = None
        self.capacity = 1  # as a backend: one batch at a time is enough, the server spreads it

    @property
    def retried(self) -> Counter[str]:
        """Retries by reason ("429", "503", "transport", ...), over every request."""
        return self.transport.retried

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.transport.close()

    # -- requests -------------------------------------------------------------------------------

    def health(self) -> bool:
        return self.transport.healthy()

    def info(self, *, refresh: bool = False) -> ServerInfo:
        if self._info is None or refresh:
            self._info = ServerInfo.model_validate_json(self.transport.request("GET", "/v1/info").content)
        return self._info

    def metrics(self) -> str:
        return self.transport.request("GET", "/metrics").text

    def submit(self, items: Sequence[ItemIn], *, size: Size | None = None, policy: PolicyName | None = None,
               deadline: float | None = None) -> Accepted:
        """Store one job on the server (items as built by `kernelrl.backends.api.wire_item`)."""
        req = EvaluateRequest(items=list(items), size=size or self.config.size, policy=policy or self.config.policy)
        body = req.model_dump_json(exclude_none=True).encode()
        resp = self.transport.request("POST", "/v1/evaluate", body=body, deadline=deadline)
        return Accepted.model_validate_json(resp.content)

    def job(self, job_id: str, *, wait_s: float = 0.0, deadline: float | None = None) -> JobReply:
        resp = self.transport.request("GET", f"/v1/jobs/{job_id}", params={"wait": f"{wait_s:g}"} if wait_s else None,
                             timeout_s=self.config.request_timeout_s + wait_s, deadline=deadline)
        return JobReply.model_validate_json(resp.content)

    def wait(self, job_id: str, *, deadline: float | None = None) -> list[EvalResult]:
        """The results of an evaluate job, once it is done (long polls; survives server restarts)."""
        return [EvalResult.from_dict(r) for r in self._wait(job_id, JobKind.EVALUATE, deadline)]

    def _wait(self, job_id: str, kind: JobKind, deadline: float | None) -> list[dict[str, Any]]:
        """A job's results once it is done; ServeError when it failed or the deadline passed."""
        while True:
            wait_s = self.config.wait_s
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ServeError(f"job {job_id} is not done by the call's deadline; it goes on on the server "
                                     f"(wait for it with RewardClient.wait({job_id!r}))")
                wait_s = min(wait_s, max(left, 0.0))
            reply = self.job(job_id, wait_s=wait_s, deadline=deadline)
            if reply.state is JobState.FAILED:
                raise ServeError(f"job {job_id} failed on the server: {reply.error}")
            if reply.state is JobState.DONE:
                if reply.kind is not kind:
                    raise ServeError(f"job {job_id} is a {reply.kind} job, not a {kind} job")
                if any(r is None for r in reply.results) or len(reply.results) != reply.items:
                    raise ServeError(f"job {job_id} is done but its results are incomplete")
                return [r for r in reply.results if r is not None]

    # -- the backend interface ------------------------------------------------------------------

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str] | tuple[Task, Candidate | str, str]], *,
                       size: Size | None = None, policy: PolicyName | None = None) -> list[EvalResult]:
        """Judge every (task, candidate[, key]) on the server; results in the order given."""
        if not items:
            return []
        deadline = self.config.deadline()
        call = uuid.uuid4().hex
        wire = []
        for i, entry in enumerate(items):
            task, cand = entry[0], entry[1]
            key = entry[2] if len(entry) > 2 else f"{call}-{i}"
            source = cand.source if isinstance(cand, Candidate) else cand
            wire.append(wire_item(task, source, key))
        jobs = [self.submit(chunk, size=size, policy=policy, deadline=deadline).job for chunk in self._chunks(wire)]
        return [r for job_id in jobs for r in self.wait(job_id, deadline=deadline)]

    def evaluate(self, task: Task, candidate: Candidate | str) -> EvalResult:
        return self.evaluate_batch([(task, candidate)])[0]

    def profile(self, task: Task, *, size: Size | None = None) -> TaskProfile | None:
        """What the server's reference worker reads about a task (shapes, FLOPs, traits): a
        profile job, queued on the server like evaluations.

        Raises TaskError with the server's one-line reason when the task's reference fails.
        """
        deadline = self.config.deadline()
        builtin = task.suite == "builtin"
        body = ProfileRequest(task=task.name if builtin else task.source, name=None if builtin else task.name or None,
                              size=size or self.config.size).model_dump_json(exclude_none=True).encode()
        accepted = Accepted.model_validate_json(self.transport.request("POST", "/v1/profile", body=body,
                                                              deadline=deadline).content)
        (outcome,) = [ProfileOutcome.from_dict(r) for r in self._wait(accepted.job, JobKind.PROFILE, deadline)]
        if outcome.error is not None:
            raise TaskError(outcome.error)
        return TaskProfile.from_dict(outcome.profile) if outcome.profile else None

    # -- refinement sessions --------------------------------------------------------------------

    def open_session(self, task: Task, **settings: Any) -> RemoteSession:
        """A refinement episode on the server (see `create_session` for the settings)."""
        return RemoteSession(self, self.create_session(task, **settings))

    def create_session(self, task: Task, *, turns: int = 3, size: Size | None = None,
                       policy: PolicyName | None = None, gamma: float | None = None,
                       history_tokens: int | None = None, key: str | None = None) -> SessionReply:
        builtin = task.suite == "builtin"
        body = SessionCreate(task=task.name if builtin else task.source, name=None if builtin else task.name or None,
                             turns=turns, size=size or self.config.size, policy=policy or self.config.policy,
                             gamma=gamma, history_tokens=history_tokens, key=key or uuid.uuid4().hex)
        resp = self.transport.request("POST", "/v1/sessions", body=body.model_dump_json(exclude_none=True).encode())
        return SessionReply.model_validate_json(resp.content)

    def session(self, session_id: str) -> SessionReply:
        return SessionReply.model_validate_json(self.transport.request("GET", f"/v1/sessions/{session_id}").content)

    def close_session(self, session_id: str) -> SessionReply:
        return SessionReply.model_validate_json(self.transport.request("DELETE", f"/v1/sessions/{session_id}").content)

    def session_prompt(self, session_id: str) -> PromptReply:
        """The next turn's prompt, once the server can build it (long polls within `timeout_s`)."""
        deadline = self.config.deadline()
        while True:
            reply = PromptReply.model_validate_json(self.transport.long_poll(f"/v1/sessions/{session_id}/prompt", deadline))
            if reply.state != "waiting":
                return reply

    def submit_turn(self, session_id: str, *, answer: str | None = None, candidate: str | None = None,
                    turn: int | None = None) -> TurnReply:
        """Take the next turn (`turn`: its number; asked of the server when not given) and wait
        for its verdict within `timeout_s`; a turn that could not be judged comes back `failed`."""
        deadline = self.config.deadline()
        if turn is None:
            turn = self.session(session_id).next_turn
            if turn is None:
                raise ServeError(f"session {session_id} takes no more turns (done or closed)", status=409)
        body = TurnSubmit(answer=answer, candidate=candidate, turn=turn).model_dump_json(exclude_none=True).encode()
        wait_s = self.transport.wait_within(deadline)
        resp = self.transport.request("POST", f"/v1/sessions/{session_id}/turns", body=body, params={"wait": f"{wait_s:g}"},
                             timeout_s=self.config.request_timeout_s + wait_s, deadline=deadline)
        reply = TurnReply.model_validate_json(resp.content)
        while reply.state is TurnState.PENDING:
            reply = TurnReply.model_validate_json(self.transport.long_poll(f"/v1/sessions/{session_id}/turns/{turn}",
                                                                  deadline))
        return reply

    def _chunks(self, wire: list[ItemIn]) -> list[list[ItemIn]]:
        info = self.info()
        per_job = min(self.config.items_per_job or info.max_items_per_job, info.max_items_per_job)
        budget = int(info.max_body_bytes * _BODY_MARGIN)
        chunks: list[list[ItemIn]] = [[]]
        used = 0
        for item in wire:
            size = len(item.task.encode()) + len(item.candidate.encode()) + 512
            if chunks[-1] and (len(chunks[-1]) >= per_job or used + size > budget):
                chunks.append([])
                used = 0
            chunks[-1].append(item)
            used += size
        return chunks


class RemoteSession:
    """One refinement episode on the server, in OpenEnv's reset/step/state style: `prompt()` is
    the observation, `step(answer)` a turn (verdict, reward, done, next prompt), `state()` the
    session, `close()` ends it (also on leaving a `with` block)."""

    def __init__(self, client: RewardClient, reply: SessionReply) -> None:
        self.client = client
        self.id = reply.session
        self.task = reply.task
        self.turns = reply.turns
        self.next_turn: int | None = reply.next_turn

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def prompt(self) -> str:
        reply = self.client.session_prompt(self.id)
        if reply.prompt is None:
            raise ServeError(f"session {self.id} takes no more turns ({reply.state})", status=409)
        return reply.prompt

    def step(self, answer: str | None = None, *, candidate: str | None = None) -> TurnReply:
        if self.next_turn is None:
            raise ServeError(f"session {self.id} takes no more turns", status=409)
        reply = self.client.submit_turn(self.id, answer=answer, candidate=candidate, turn=self.next_turn)
        if reply.state is TurnState.JUDGED:
            self.next_turn = None if reply.done else reply.turn + 1
        return reply

    def state(self) -> SessionReply:
        reply = self.client.session(self.id)
        self.next_turn = reply.next_turn
        return reply

    def close(self) -> SessionReply:
        reply = self.client.close_session(self.id)
        self.next_turn = None
        return reply
