"""The rows of the code database, as typed records (what `kernelrl.search.database` returns).

Guarantees: records are frozen; a `CandidateRecord` carries its typed `EvalResult` once judged;
`NewCandidate` validates what is about to be stored. Does not touch the database file.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from kernelrl.result import EvalResult, Severity, Status


class CandidateState(str, enum.Enum):
    PROPOSED = "proposed"  # answer stored, not evaluated yet (a resumed run evaluates it)
    EVALUATED = "evaluated"  # result stored


class RunStatus(str, enum.Enum):
    RUNNING = "running"  # also what a killed run looks like
    FINISHED = "finished"
    INTERRUPTED = "interrupted"  # stopped by Ctrl-C
    FAILED = "failed"


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    id: int
    config: dict[str, Any]
    started: float  # seconds since the epoch
    finished: float | None
    status: RunStatus


@dataclass(frozen=True, kw_only=True)
class TaskRecord:
    name: str
    source: str
    source_hash: str  # `Task.identity_hash`: the source and its size presets (verdicts are stored against it)
    level: int | None
    size: str


@dataclass(frozen=True, kw_only=True)
class BaselineRecord:
    task: str
    device: str
    size: str
    eager_ms: float
    compile_ms: float | None  # None: torch.compile failed or was not measured
    measured: float  # seconds since the epoch
    compile_ci: tuple[float, float] | None = None  # 95 % interval of eager / compiled (None: not known)

    @property
    def compile_within_noise(self) -> bool:
        """torch.compile and eager cannot be told apart on this task: the ratio's interval holds 1.0."""
        return self.compile_ci is not None and self.compile_ci[0] <= 1.0 <= self.compile_ci[1]


@dataclass(frozen=True, kw_only=True)
class FindingRecord:
    candidate_id: int
    rule: str
    severity: Severity
    stage: str
    message: str


@dataclass(frozen=True, kw_only=True)
class CandidateRecord:
    """One proposal for a task, with its evaluation once there is one."""

    id: int
    run_id: int | None
    task: str
    hash: str
    source: str  # empty when the answer held no complete code block
    parents: tuple[int, ...]  # candidate ids this one improves on (empty: from the reference)
    chain: int
    step: int
    proposer: str
    prompt: str
    answer: str
    prompt_tokens: int
    completion_tokens: int
    created: float  # seconds since the epoch
    state: CandidateState
    meta: dict[str, Any] = field(default_factory=dict)
    result: EvalResult | None = None

    @property
    def status(self) -> Status | None:
        return self.result.status if self.result else None

    @property
    def speedup(self) -> float | None:
        return self.result.speedup if self.result else None

    @property
    def is_correct(self) -> bool:
        return self.result is not None and self.result.status is Status.CORRECT


@dataclass(frozen=True, kw_only=True)
class HackCase:
    """One refused program and one rule that refused it."""

    candidate_id: int
    task: str
    hash: str
    rule: str
    stage: str  # "static" or "dynamic"
    message: str
    line: int | None
    created: float
    source: str


@dataclass(frozen=True, kw_only=True)
class NewCandidate:
    """What the search loop knows about a proposal before it is stored."""

    task: str
    hash: str
    source: str
    parents: tuple[int, ...] = ()
    chain: int = 0
    step: int = 0
    proposer: str = ""
    prompt: str = ""
    answer: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    run_id: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0 or self.completion_tokens < 0:
            raise ValueError("token counts must be >= 0")
        if self.chain < 0 or self.step < 0:
            raise ValueError("chain and step must be >= 0")
