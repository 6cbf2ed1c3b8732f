"""The proposer interface: a request in, a proposal out, and the errors a proposer may raise.

Guarantees: every proposer returns a `Proposal` for every answer a model gave (an answer
without a complete code block has `code=None` and keeps its text); a finite proposer raises
`Exhausted` when it has nothing left for a task; an endpoint that keeps failing raises
`ProposerUnavailable`; a bad spec or option raises `ProposerError` with a one-line message.
Implementations are safe to call from several threads at once.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kernelrl.candidate import extract_code
from kernelrl.tasks.task import Task

if TYPE_CHECKING:
    from kernelrl.jsontypes import JSONObject
    from kernelrl.judge.harness.profile import TaskProfile


class ProposerError(RuntimeError):
    """A proposer cannot be built or used; the message says why, for a person."""


class Exhausted(ProposerError):
    """A finite proposer has no more programs for the requested task."""


class ProposerUnavailable(ProposerError):
    """The model endpoint kept failing after every retry the policy allows."""


@dataclass(frozen=True, kw_only=True)
class ProposalRequest:
    """One ask: improve `task`. `parent` is the source of the chain's current best (None at first)."""

    task: Task
    prompt: str
    parent: str | None = None
    chain: int = 0
    step: int = 0
    # What the judge read about the task in its reference worker (kernelrl.judge.harness.profile.TaskProfile);
    # None when unknown. Proposers use it instead of running task code.
    profile: TaskProfile | None = None


@dataclass(frozen=True, kw_only=True)
class Proposal:
    """What came back. `code` is None when the answer holds no complete program."""

    answer: str
    code: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    meta: JSONObject = field(default_factory=dict)  # stored as JSON with the candidate (`RunMeta.proposer`)


def proposal_from_answer(answer: str | None, *, prompt_tokens: int = 0, completion_tokens: int = 0,
                         meta: JSONObject | None = None) -> Proposal:
    text = answer or ""
    return Proposal(answer=text, code=extract_code(text), prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens, meta=dict(meta or {}))


class Proposer(ABC):
    """Turns a request into a proposal. Implementations are thread-safe."""

    spec: str
    # True when `propose_many` samples its n answers in one batch (a local model): a caller that
    # wants several answers to one prompt asks for them together instead of one call each
    batched: bool = False

    @abstractmethod
    def propose(self, request: ProposalRequest) -> Proposal: ...

    def propose_many(self, request: ProposalRequest, n: int) -> list[Proposal]:
        """n answers to one request (`step` counting up from the request's); fewer when a finite
        proposer runs out after the first. The default asks `propose` n times in order."""
        out: list[Proposal] = []
        for i in range(n):
            try:
                out.append(self.propose(dataclasses.replace(request, step=request.step + i)))
            except Exhausted:
                if not out:
                    raise
                break
        return out

    def close(self) -> None:  # noqa: B027 - optional hook, empty by design
        """Release clients or models; the default has nothing to release."""
