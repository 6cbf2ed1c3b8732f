"""The reward server's wire format: request and reply models, and how an item names its task.

One definition for both ends: the server validates requests with these models and the client
builds them with `wire_item`.

- `POST /v1/evaluate` takes `EvaluateRequest`: items of {task, candidate, key?, name?}, an
  optional size and policy; it answers 202 `Accepted` {job, items, reused, state}.
- `POST /v1/profile` takes `ProfileRequest` {task, name?, size?} and answers 202 `Accepted`: a
  profile job, queued like any other.
- `GET /v1/jobs/ID[?wait=S]` answers `JobReply` {job, kind, state, items, results, error}: per
  item, `EvalResult.to_dict()` (what `kernelrl eval --json` prints) in an evaluate job,
  `ProfileOutcome.to_dict()` {task, profile, error} in a profile job; None while pending; a
  failed job has `error` and no results.
- the session routes (`kernelrl.serve.sessions`) take `SessionCreate` and `TurnSubmit` and
  answer `SessionReply`, `PromptReply` and `TurnReply`;
- errors are `ErrorReply` {error}: 400 bad request, 401 no or wrong token, 403 foreign Host or
  a web page's request, 404 unknown job or session (or another client's), 409 idempotency key
  reused for something else, or a turn that cannot be taken now, 413 too large, 415 a body that
  is not JSON, 429 queue full (Retry-After) or too many open sessions. Routes raise `ApiError`;
  `parse_body` turns a body into a request model, its size checked first.

`check_body` bounds a body's cost before it is parsed: it counts the JSON tokens and the items
and measures the strings in one pass, linear in the body's length whatever it holds, that stops
at the first limit passed, so a body of a million tiny items is refused after reading a few
thousand of them, and no body (unterminated strings of escaped quotes included) costs more than
reading it once.

An item's `task` is either a built-in task name (resolved with `builtin_task`, never as a path)
or a full KernelBench-format source; `resolve_task` checks a source with `ast` only and never
executes it: task code runs only in the evaluator's sandboxed workers.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kernelrl.checks.policy import PolicyName
from kernelrl.tasks.source import is_task_source
from kernelrl.tasks.suites import builtin_task
from kernelrl.tasks.task import Size, Task, TaskError

API_VERSION = "v1"
MAX_KEY_CHARS = 200
# Names are labels only (they name the result and the reward's smoothing window): printable, short.
NAME_PATTERN = r"^[^\x00-\x1f\x7f]{1,200}$"
# JSON tokens that check_body counts: a string, or a structural character (scalars need a comma
# or a colon next to them, so these bound every value). A string's start is found by `_JSON_TOKEN_START`
# and its rest read once by `_JSON_STRING_REST` (no backtracking, never retried from inside it):
# the scan is linear in the body whatever it holds (an unterminated string of escaped quotes
# included, which a single alternation pattern scanned in quadratic time).
_JSON_TOKEN_START = re.compile(rb'["{}\[\],:]')
_JSON_STRING_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)
_SCAN_SLICE = 1 << 16
TOKENS_PER_ITEM = 20  # {, four keys with their colons and values, commas, }: 17 at most
TOKENS_ENVELOPE = 32  # the request's own object, its keys and values
ESCAPED_BYTES_PER_BYTE = 6  # a JSON string may spell one byte as \uXXXX
MAX_TURNS = 16  # turns of one session at most
# An absolute file path of two or more parts (what tracebacks and compiler output name): shown as
# its last part. Each part ends at the next "/", so the pattern matches in linear time.
_SERVER_PATH = re.compile(r"(?:/[\w.+@-]+){2,}")
M = TypeVar("M", bound=BaseModel)
_J = TypeVar("_J")  # a value as JSON, given back with the same type


class JobState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"  # its results could not be stored; `error` says why


class JobKind(enum.StrEnum):
    EVALUATE = "evaluate"  # candidates judged against tasks
    PROFILE = "profile"  # what a reference worker reads about a task


class TurnState(enum.StrEnum):
    PENDING = "pending"  # its job is queued or running
    JUDGED = "judged"  # verdict and reward recorded
    FAILED = "failed"  # its job could not be finished; the same turn may be submitted again


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileOutcome:
    """The result of a profile job: the task's profile (`TaskProfile.to_dict()`, None when the
    reference worker found nothing to report), or why its reference failed."""

    task: str
    profile: dict[str, Any] | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "profile": self.profile, "error": self.error}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProfileOutcome:
        return cls(task=str(d["task"]), profile=d.get("profile"), error=d.get("error"))


class ApiError(Exception):
    """An HTTP error answer: status, message (the `error` of the body), the reason it is counted
    under in `rejected_total`, and headers (Retry-After, WWW-Authenticate)."""

    def __init__(self, status: int, message: str, *, reason: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason  # counted in rejected_total
        self.headers = headers or {}


class ItemIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, description="a built-in task name, or a KernelBench-format source")
    candidate: str = Field(min_length=1, description="source defining ModelNew")
    key: str | None = Field(default=None, min_length=1, max_length=MAX_KEY_CHARS,
                            description="idempotency key: the same key always returns the first result")
    name: str | None = Field(default=None, pattern=NAME_PATTERN, description="name of a task given as source")


class EvaluateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[ItemIn] = Field(min_length=1)
    size: Size | None = None
    policy: PolicyName | None = None


class Accepted(BaseModel):
    job: str
    items: int
    reused: int  # items answered from idempotency keys already stored
    state: JobState


class JobReply(BaseModel):
    job: str
    kind: JobKind = JobKind.EVALUATE
    state: JobState
    items: int
    results: list[dict[str, Any] | None]
    error: str | None = None  # why a failed job failed


class ServerInfo(BaseModel):
    api: str = API_VERSION
    backend: str
    devices: list[str]
    size: Size
    policy: PolicyName
    max_items_per_job: int
    max_pending_items: int
    max_body_bytes: int
    max_source_bytes: int


class ErrorReply(BaseModel):
    error: str


class ProfileRequest(BaseModel):
    """Ask what a reference worker reads about a task: shapes, constants, FLOPs, traits."""

    model_config = ConfigDict(extra="forbid")
    task: str = Field(min_length=1, description="a built-in task name, or a KernelBench-format source")
    name: str | None = Field(default=None, pattern=NAME_PATTERN, description="name of a task given as source")
    size: Size | None = None


class SessionCreate(BaseModel):
    """Start a refinement episode on a task (`POST /v1/sessions`)."""

    model_config = ConfigDict(extra="forbid")
    task: str = Field(min_length=1, description="a built-in task name, or a KernelBench-format source")
    name: str | None = Field(default=None, pattern=NAME_PATTERN, description="name of a task given as source")
    turns: int = Field(default=3, ge=1, le=MAX_TURNS, description="answers in the episode")
    size: Size | None = None
    policy: PolicyName | None = None
    gamma: float | None = Field(default=None, ge=0.0, le=1.0, description="discount of later turns' rewards")
    history_tokens: int | None = Field(default=None, ge=200, le=1 << 20,
                                       description="the most the earlier turns may take of a prompt")
    key: str | None = Field(default=None, min_length=1, max_length=MAX_KEY_CHARS,
                            description="idempotency key: the same key returns the same session")


class TurnSubmit(BaseModel):
    """The next turn's answer (its code is extracted) or a bare candidate source."""

    model_config = ConfigDict(extra="forbid")
    answer: str | None = Field(default=None, min_length=1, description="the model's answer (code in a fenced block)")
    candidate: str | None = Field(default=None, min_length=1, description="source defining ModelNew")
    turn: int | None = Field(default=None, ge=1, le=MAX_TURNS,
                             description="the turn this answers (a retry of a stored turn returns it)")

    @model_validator(mode="after")
    def _one(self) -> TurnSubmit:
        if (self.answer is None) == (self.candidate is None):
            raise ValueError("give exactly one of answer and candidate")
        return self


class TurnReply(BaseModel):
    session: str
    turn: int
    state: TurnState
    job: str | None = None  # the evaluate job judging it (its full result: GET /v1/jobs/ID)
    status: str | None = None  # the verdict's status; "no_code" when the answer held no code
    speedup: float | None = None  # against eager, correct and timed results only
    verdict: str | None = None  # the verdict as the next turn's prompt shows it
    reward: float | None = None  # kernelrl.reward's value; None: nothing to pay (the task failed)
    done: bool = False  # the episode's last turn was judged
    prompt: str | None = None  # the next turn's prompt, once this one is judged and more turns remain
    error: str | None = None  # why a failed turn failed (submit it again)


class SessionReply(BaseModel):
    session: str
    task: str
    turns: int
    next_turn: int | None  # None when the episode is done or closed
    size: Size
    policy: PolicyName
    gamma: float
    done: bool
    closed: bool
    history: list[TurnReply]
    rewards: list[float | None]  # per judged turn
    returns: list[float | None]  # per judged turn: reward + gamma * the next turn's return (final once done)


class PromptReply(BaseModel):
    session: str
    turn: int | None  # the turn the prompt is for; None when none is left
    state: str  # ready | waiting (the profile, or the previous turn's verdict) | done | closed
    prompt: str | None = None
    profile_error: str | None = None  # why the prompt holds no shapes (the task's reference failed, say)


class BadItem(ValueError):
    """An item the server cannot accept; the message names the item and says why."""


class TooLarge(ValueError):
    """A request over a limit (items, tokens, one string's size); the message says which."""


def _string_end(body: bytes, pos: int, bound: int) -> int:
    """Where the JSON string whose content starts at `pos` ends (its closing quote), `bound` when
    it runs past `bound`, or `len(body)` when it is never closed. Reads each byte once, in slices
    of `_SCAN_SLICE` so that no single regular-expression call holds the interpreter for long."""
    while True:
        stop = min(bound, pos + _SCAN_SLICE)
        rest = _JSON_STRING_REST.match(body, pos, stop)
        end = rest.end() if rest is not None else pos
        if end < len(body) and body[end] == 0x22:
            return end
        if end >= len(body) or stop >= bound:
            return len(body) if end >= len(body) else bound
        pos = end  # cut at the slice's end (an escape's backslash may be its last byte): go on from there


def check_body(body: bytes, *, max_items: int, max_string_bytes: int) -> None:
    """Refuse (TooLarge) a JSON body with more than `max_items` items (objects inside the
    top-level object's arrays), more tokens than that many items can hold, or a string that
    cannot decode to `max_string_bytes` or fewer, before anything is parsed. Reads at most
    `TOKENS_PER_ITEM * max_items + TOKENS_ENVELOPE` tokens, each byte once."""
    limit = TOKENS_PER_ITEM * max_items + TOKENS_ENVELOPE
    longest = ESCAPED_BYTES_PER_BYTE * max_string_bytes + 2
    depth = items = n = pos = 0
    while (m := _JSON_TOKEN_START.search(body, pos)) is not None:
        n += 1
        if n > limit:
            raise TooLarge(f"the request holds more than {limit} JSON values (more than {max_items} items in one "
                           "job?); split the batch")
        start = m.start()
        first = body[start]
        if first == 0x22:  # a string: its rest, read once
            end = _string_end(body, start + 1, min(len(body), start + longest))
            if end - start + 1 > longest:
                raise TooLarge(f"a string of more than {longest - 2} bytes; a source is at most {max_string_bytes} "
                               "bytes")
            if end >= len(body):  # unterminated: not JSON (the parser says so), and nothing follows
                return
            pos = end + 1
            continue
        pos = start + 1
        if first in b"{[":
            depth += 1
            if depth == 3 and first == 0x7B:  # an object in an array of the request
                items += 1
                if items > max_items:
                    raise TooLarge(f"more than {max_items} items in one job; the limit is {max_items} "
                                   "(split the batch)")
        elif first in b"}]":
            depth -= 1


def scrub_paths(value: _J) -> _J:
    """`value` (a result as JSON: dicts, lists, strings) with every absolute path of two or more
    parts cut to its file name: tracebacks and compiler output returned to clients name no
    folder of the server's machine (where kernelrl, its checkout or its caches live)."""
    if isinstance(value, str):
        return cast(_J, _SERVER_PATH.sub(lambda m: m.group(0).rsplit("/", 1)[-1], value)) if "/" in value else value
    if isinstance(value, list):
        return cast(_J, [scrub_paths(v) for v in value])
    if isinstance(value, dict):
        return cast(_J, {k: scrub_paths(v) for k, v in value.items()})
    return value


def is_task_name(spec: str) -> bool:
    """A one-line spec is a name; a source has several lines."""
    return "\n" not in spec.strip()


def resolve_task(spec: str, name: str | None = None) -> Task:
    """The task an item names, without running any of its code."""
    if is_task_name(spec):
        if name is not None:
            raise BadItem("`name` is only for a task given as source, not for a built-in task name")
        try:
            return builtin_task(spec.strip())
        except TaskError as e:
            if "ambiguous" in str(e):
                raise BadItem(str(e)) from None
            raise BadItem(f"unknown built-in task {spec.strip()[:200]!r} (send a name `kernelrl tasks` lists, or the "
                          "task's full KernelBench-format source)") from None
    try:
        ok = is_task_source(spec)
    except (ValueError, RecursionError, MemoryError):  # NUL bytes, absurd nesting: not a task
        ok = False
    if not ok:
        raise BadItem("the task source does not parse, or does not define Model, get_inputs and get_init_inputs "
                      "at module level (KernelBench format)")
    digest = hashlib.sha256(spec.encode()).hexdigest()[:12]
    return Task(name=name or f"client/{digest}", source=spec, suite="client")


def wire_item(task: Task, candidate: str, key: str | None = None) -> ItemIn:
    """The item for a task and a candidate: built-in tasks by name, others by source."""
    if task.suite == "builtin":
        return ItemIn(task=task.name, candidate=candidate, key=key)
    return ItemIn(task=task.source, candidate=candidate, key=key, name=task.name or None)


def parse_body(model: type[M], body: bytes, *, max_items: int, max_string_bytes: int) -> M:
    """A request model from a body, its size checked first (`check_body`): 413 or 400 `ApiError`."""
    try:
        check_body(body, max_items=max_items, max_string_bytes=max_string_bytes)
    except TooLarge as e:
        raise ApiError(413, str(e), reason="too_large") from None
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise ApiError(400, validation_message(e.errors()), reason="bad_request") from None


def validation_message(errors: Sequence[Mapping[str, Any]]) -> str:
    """One line from pydantic's (or FastAPI's) validation errors: the first five, where and why."""
    parts = []
    for err in errors[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc}: {err.get('msg', 'invalid')}" if loc else str(err.get("msg", "invalid")))
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "bad request: " + "; ".join(parts) + more
