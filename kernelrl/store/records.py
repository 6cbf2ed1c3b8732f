"""The rows of the code database, as typed records (what `kernelrl.store` returns).

Guarantees: records are frozen; a `CandidateRecord` carries its typed `EvalResult` once judged
and its typed `RunMeta`; `NewCandidate` validates what is about to be stored. Does not touch the
database file.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernelrl.result import EvalResult, Severity, Status

if TYPE_CHECKING:
    from kernelrl.jsontypes import JSONObject, JSONValue


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
    config: dict[str, Any]  # as its command stored it: each reader (kernelrl.report) picks the keys it knows
    started: float  # seconds since the epoch
    finished: float | None
    status: RunStatus


@dataclass(frozen=True, kw_only=True)
class TaskRecord:
    name: str
    source: str
    identity_hash: str  # `Task.identity_hash`: the source and its size presets (verdicts are stored against it)
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


class ContrastDraw(enum.StrEnum):
    """How a contrastive prompt's earlier versions are chosen (`Database.contrast_set`)."""

    # the best, then clearly weaker ones spanning the range of speeds: the best is always shown
    BEST = "best"
    # k drawn without replacement, each with weight speedup ** (1 / temperature), as CUDA-L1 samples
    # its exemplars by score: the best is often shown, not always, so an answer faster than every
    # version its prompt shows can be written and paid even after the best is known
    SCORE = "score"
    # no earlier version, not even the best: every prompt the first-attempt prompt (plain GRPO)
    NONE = "none"


class RunStage(enum.StrEnum):
    """Which command stored a candidate (none: a search)."""

    COLLECT = "collect"
    BENCH = "bench"
    RFT = "rft"
    GRPO = "grpo"


@dataclass(frozen=True, kw_only=True)
class RunMeta:
    """Where a candidate sits in its run and what training did with it; None: not that kind of run.

    Stored as one JSON object in the candidate's row: the set fields and the proposer's own keys
    side by side (the layout rows have always had, so a database written before reads the same).
    """

    stage: RunStage | None = None
    step: int | None = None  # the GRPO step
    round: int | None = None  # the RFT round
    rank: int | None = None  # the training rank that sampled it
    group: int | None = None  # its GRPO group within the step
    episode: int | None = None  # multi-turn: the episode's number (in its chain, or the trainer's batch)
    turn: int | None = None  # multi-turn: 1 for the first answer of an episode
    turns: int | None = None  # multi-turn: the episode's length
    sample: int | None = None  # the turn bench: which sample of the task
    kept: bool | None = None  # GRPO: whether its group's advantage trained on it (rollouts-of-consequence)
    reward: float | None = None  # GRPO: the reward trained on
    raw: float | None = None  # GRPO: before the clip
    clipped: bool | None = None
    band: tuple[float, float] | None = None  # the clip's window
    within_noise: bool | None = None
    copy: bool | None = None  # the program was a version its prompt showed (paid at most as no speedup)
    copy_of: int | None = None  # that version's candidate id
    shown: tuple[int, ...] | None = None  # the versions its prompt showed (candidate ids)
    excluded: str | None = None  # GRPO: why it trained on nothing (kernelrl.train.scorer.Exclusion)
    returned: float | None = None  # multi-turn GRPO: the turn's discounted return (None: it has none)
    credit: float | None = None  # multi-turn GRPO: what TRL was handed for the turn (None: nothing)
    proposer: Mapping[str, JSONValue] = field(default_factory=dict)  # what the proposer said of its answer (JSON)

    _INT = ("step", "round", "rank", "group", "episode", "turn", "turns", "sample", "copy_of")
    _FLOAT = ("reward", "raw", "returned", "credit")
    _BOOL = ("kept", "clipped", "within_noise", "copy")
    _STR = ("excluded",)

    def merged(self, other: RunMeta) -> RunMeta:
        """This meta with every field `other` sets (its proposer's keys added to this one's)."""
        changes = {f.name: getattr(other, f.name) for f in dataclasses.fields(other)
                   if f.name != "proposer" and getattr(other, f.name) is not None}
        return dataclasses.replace(self, **changes, proposer={**self.proposer, **other.proposer})

    def to_dict(self) -> JSONObject:
        out = dict(self.proposer)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "proposer" and value is not None:
                out[f.name] = list(value) if f.name in ("band", "shown") else value.value if f.name == "stage" else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, JSONValue]) -> RunMeta:
        """The stored object read back: known keys typed (a value of the wrong type is dropped, not
        trusted), every other key the proposer's."""
        known: dict[str, Any] = {}
        rest = {k: v for k, v in data.items() if k not in _FIELDS}
        for name in cls._INT:
            v = data.get(name)
            if isinstance(v, int) and not isinstance(v, bool):
                known[name] = v
        for name in cls._FLOAT:
            v = data.get(name)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                known[name] = float(v)
        for name in cls._BOOL:
            if isinstance(data.get(name), bool):
                known[name] = data[name]
        for name in cls._STR:
            if isinstance(data.get(name), str):
                known[name] = data[name]
        stage = data.get("stage")
        if stage in set(RunStage) and isinstance(stage, str):
            known["stage"] = RunStage(stage)
        band = data.get("band")
        if isinstance(band, (list, tuple)) and len(band) == 2:
            lo, hi = band
            if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
                known["band"] = (float(lo), float(hi))
        shown = data.get("shown")
        if isinstance(shown, (list, tuple)):
            ids = [i for i in shown if isinstance(i, int) and not isinstance(i, bool)]
            if len(ids) == len(shown):
                known["shown"] = tuple(ids)
        return cls(**known, proposer=rest)


_FIELDS = frozenset(f.name for f in dataclasses.fields(RunMeta))


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
    meta: RunMeta = field(default_factory=RunMeta)
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
    meta: RunMeta = field(default_factory=RunMeta)

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0 or self.completion_tokens < 0:
            raise ValueError("token counts must be >= 0")
        if self.chain < 0 or self.step < 0:
            raise ValueError("chain and step must be >= 0")
