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
- errors are `ErrorReply` {error}: 400 bad request, 401 no or wrong token, 403 foreign Host or
  a web page's request, 404 unknown job (or another client's), 409 idempotency key reused for
  something else, 413 too large, 415 a body that is not JSON, 429 queue full (Retry-After).

`check_body` bounds a body's cost before it is parsed: it counts the JSON tokens and the items
and measures the strings with one regular-expression pass that stops at the first limit passed,
so a body of a million tiny items is refused after reading a few thousand of them.

An item's `task` is either a built-in task name (resolved with `builtin_task`, never as a path)
or a full KernelBench-format source; `resolve_task` checks a source with `ast` only and never
executes it: task code runs only in the evaluator's sandboxed workers.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kernelrl.checks.policy import PolicyName
from kernelrl.serve.jobs import JobKind, JobState
from kernelrl.tasks.source import is_task_source
from kernelrl.tasks.suites import builtin_task
from kernelrl.tasks.task import Size, Task, TaskError

API_VERSION = "v1"
MAX_KEY_CHARS = 200
# Names are labels only (they name the result and the reward's smoothing window): printable, short.
NAME_PATTERN = r"^[^\x00-\x1f\x7f]{1,200}$"
# JSON tokens that check_body counts: a string, or a structural character (scalars need a comma
# or a colon next to them, so these bound every value).
_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\],:]', re.DOTALL)
TOKENS_PER_ITEM = 20  # {, four keys with their colons and values, commas, }: 17 at most
TOKENS_ENVELOPE = 32  # the request's own object, its keys and values
ESCAPED_BYTES_PER_BYTE = 6  # a JSON string may spell one byte as \uXXXX


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


class BadItem(ValueError):
    """An item the server cannot accept; the message names the item and says why."""


class TooLarge(ValueError):
    """A request over a limit (items, tokens, one string's size); the message says which."""


def check_body(body: bytes, *, max_items: int, max_string_bytes: int) -> None:
    """Refuse (TooLarge) a JSON body with more than `max_items` items (objects inside the
    top-level object's arrays), more tokens than that many items can hold, or a string that
    cannot decode to `max_string_bytes` or fewer, before anything is parsed. Reads at most
    `TOKENS_PER_ITEM * max_items + TOKENS_ENVELOPE` tokens (regular-expression matches)."""
    limit = TOKENS_PER_ITEM * max_items + TOKENS_ENVELOPE
    longest = ESCAPED_BYTES_PER_BYTE * max_string_bytes + 2
    depth = items = 0
    for n, m in enumerate(_JSON_TOKEN.finditer(body), 1):
        if n > limit:
            raise TooLarge(f"the request holds more than {limit} JSON values (more than {max_items} items in one "
                           "job?); split the batch")
        first = body[m.start()]
        if first == 0x22:  # a string
            if m.end() - m.start() > longest:
                raise TooLarge(f"a string of {m.end() - m.start() - 2} bytes; a source is at most {max_string_bytes} "
                               "bytes")
        elif first in b"{[":
            depth += 1
            if depth == 3 and first == 0x7B:  # an object in an array of the request
                items += 1
                if items > max_items:
                    raise TooLarge(f"more than {max_items} items in one job; the limit is {max_items} "
                                   "(split the batch)")
        elif first in b"}]":
            depth -= 1


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
