"""Typed evaluation results: the reward signal every other part of kernelrl optimises.

Guarantees: a result always has a `Status`; `speedup` is set only when the status is CORRECT;
times carry their unit in the field name; `findings` name the rule or defence that fired.
Results round-trip through JSON (`to_dict` / `from_dict`) without loss, so the database and the
CLI share one format. Does not guarantee anything about how the numbers were measured: that is
the evaluator's contract.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):
    CORRECT = "correct"
    INCORRECT = "incorrect"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    FLAGGED = "flagged"
    # The task's own reference could not be loaded or run (it hangs, crashes, exhausts memory):
    # no verdict on the candidate at all, and no reward.
    TASK_ERROR = "task_error"


class Severity(str, enum.Enum):
    REJECT = "reject"  # the finding alone makes the verdict FLAGGED
    WARN = "warn"  # recorded and shown, verdict unchanged


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One rule or defence that fired, static (source) or dynamic (run time)."""

    rule: str
    message: str
    severity: Severity = Severity.REJECT
    stage: str = "dynamic"  # "static" or "dynamic"
    line: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "message": self.message, "severity": self.severity.value,
                "stage": self.stage, "line": self.line}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        return cls(rule=d["rule"], message=d["message"], severity=Severity(d.get("severity", "reject")),
                   stage=d.get("stage", "dynamic"), line=d.get("line"))


@dataclass(frozen=True, kw_only=True)
class TimingStats:
    """Per-call wall times of one program, in milliseconds."""

    median_ms: float
    mean_ms: float
    min_ms: float
    iqr_ms: float  # interquartile range: the spread we report
    n: int

    @classmethod
    def from_samples_ms(cls, samples: list[float]) -> TimingStats:
        if not samples:
            raise ValueError("no timing samples")
        s = sorted(samples)
        n = len(s)

        def q(p: float) -> float:
            # linear interpolation between closest ranks
            x = p * (n - 1)
            lo = int(x)
            hi = min(lo + 1, n - 1)
            return s[lo] + (s[hi] - s[lo]) * (x - lo)

        return cls(median_ms=q(0.5), mean_ms=sum(s) / n, min_ms=s[0], iqr_ms=q(0.75) - q(0.25), n=n)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> TimingStats | None:
        return None if d is None else cls(**d)


@dataclass(kw_only=True)
class EvalResult:
    """The verdict on one candidate for one task."""

    task: str
    status: Status
    message: str = ""  # one line a person reads first
    speedup: float | None = None  # reference median / candidate median; CORRECT only
    speedup_ci: tuple[float, float] | None = None  # 95 % interval of the speedup
    noise_band: tuple[float, float] | None = None  # the task's A/A band: speedups identical code measured at
    ref_time: TimingStats | None = None
    cand_time: TimingStats | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    roofline_pct: float | None = None  # the candidate's share of the task's roofline on this machine; CORRECT only
    ref_roofline_pct: float | None = None  # the reference's share, measured in the same run
    build_time_s: float | None = None
    eval_time_s: float | None = None
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # compiler output, tracebacks, log tails
    environment: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    size: str = "small"
    policy: str = "open"
    candidate_hash: str = ""
    build_cached: bool = False

    def __post_init__(self) -> None:
        if self.status is not Status.CORRECT and (self.speedup is not None or self.roofline_pct is not None):
            raise ValueError(f"speedup and roofline are only defined for correct candidates, not {self.status.value}")

    @property
    def rejecting_rules(self) -> list[str]:
        return [f.rule for f in self.findings if f.severity is Severity.REJECT]

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "status": self.status.value,
            "message": self.message,
            "speedup": self.speedup,
            "speedup_ci": list(self.speedup_ci) if self.speedup_ci else None,
            "noise_band": list(self.noise_band) if self.noise_band else None,
            "ref_time": self.ref_time.to_dict() if self.ref_time else None,
            "cand_time": self.cand_time.to_dict() if self.cand_time else None,
            "max_abs_err": self.max_abs_err,
            "max_rel_err": self.max_rel_err,
            "roofline_pct": self.roofline_pct,
            "ref_roofline_pct": self.ref_roofline_pct,
            "build_time_s": self.build_time_s,
            "eval_time_s": self.eval_time_s,
            "findings": [f.to_dict() for f in self.findings],
            "errors": list(self.errors),
            "environment": dict(self.environment),
            "device": self.device,
            "size": self.size,
            "policy": self.policy,
            "candidate_hash": self.candidate_hash,
            "build_cached": self.build_cached,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvalResult:
        ci = d.get("speedup_ci")
        band = d.get("noise_band")
        return cls(
            task=d["task"],
            status=Status(d["status"]),
            message=d.get("message", ""),
            speedup=d.get("speedup"),
            speedup_ci=tuple(ci) if ci else None,
            noise_band=tuple(band) if band else None,
            ref_time=TimingStats.from_dict(d.get("ref_time")),
            cand_time=TimingStats.from_dict(d.get("cand_time")),
            max_abs_err=d.get("max_abs_err"),
            max_rel_err=d.get("max_rel_err"),
            roofline_pct=d.get("roofline_pct"),
            ref_roofline_pct=d.get("ref_roofline_pct"),
            build_time_s=d.get("build_time_s"),
            eval_time_s=d.get("eval_time_s"),
            findings=[Finding.from_dict(f) for f in d.get("findings", [])],
            errors=list(d.get("errors", [])),
            environment=dict(d.get("environment", {})),
            device=d.get("device", "cpu"),
            size=d.get("size", "small"),
            policy=d.get("policy", "open"),
            candidate_hash=d.get("candidate_hash", ""),
            build_cached=bool(d.get("build_cached", False)),
        )
