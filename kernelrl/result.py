"""Typed evaluation results: the reward signal every other part of kernelrl optimises.

Guarantees: a result always has a `Status`; `speedup` is set only when the status is CORRECT;
`timing` says whether its times are the program's (`INTERPRETED`: outputs checked, never
timed); times carry their unit in the field name; `findings` name the rule or defence that fired; what
the judge recorded about how a result was obtained is typed (`Environment`: the machine, the
reference, the timing, the roofline, the LLM review), never a dict read by string keys.
Results round-trip through JSON (`to_dict` / `from_dict`, both `kernelrl.plain`) without loss,
so the database, the server and the CLI share one format; a result stored by an older version
loads with the fields it has (unknown keys are ignored, missing ones take their defaults).

Does not guarantee anything about how the numbers were measured: that is the evaluator's
contract.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from kernelrl.plain import from_plain, to_plain

if TYPE_CHECKING:
    from kernelrl.jsontypes import JSONObject

# The message of every NO_CODE result (and of the `compile_error` rows older versions stored for one).
NO_CODE_MESSAGE = "the answer holds no complete code block"
# The candidate hash of an answer without code: the hash of the empty source (`kernelrl.candidate.source_hash("")`).
NO_CODE_HASH = hashlib.sha256(b"").hexdigest()


class Status(str, enum.Enum):
    CORRECT = "correct"
    INCORRECT = "incorrect"
    COMPILE_ERROR = "compile_error"
    # The answer held no complete code block: nothing was judged (the reward model's `no_code`
    # penalty). Stored results written before this name existed say `compile_error` with
    # `NO_CODE_MESSAGE`; `EvalResult.from_dict` reads them as NO_CODE.
    NO_CODE = "no_code"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    FLAGGED = "flagged"
    # The task's own reference could not be loaded or run (it hangs, crashes, exhausts memory):
    # no verdict on the candidate at all, and no reward.
    TASK_ERROR = "task_error"
    # The judge itself failed while running the candidate (its worker pool, the machine): not the
    # candidate's doing, so no verdict and no reward; never cached or reused, a later try judges it.
    JUDGE_ERROR = "judge_error"


class Containment(str, enum.Enum):
    """How the worker that ran a program was walled off (`kernelrl.judge.isolation.containment` says what each means)."""

    FULL = "full"  # bubblewrap: own uid, read-only system, private scratch, no network, no judge state
    NAMESPACES = "namespaces"  # own PID and mount namespaces, no capabilities; the judge's files and network
    NONE = "none"  # a plain child process


class Timing(str, enum.Enum):
    """What a result's times are worth."""

    MEASURED = "measured"  # timed against the reference in a group (a correct result has a speedup)
    # Ran under an interpreter (Triton on a CPU): outputs checked, times meaningless, never timed.
    INTERPRETED = "interpreted"


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

    def to_dict(self) -> JSONObject:
        return _plain_dict(self)

    @classmethod
    def from_dict(cls, d: JSONObject) -> Finding:
        return from_plain(cls, d, strict=False)


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

    def to_dict(self) -> JSONObject:
        return _plain_dict(self)

    @classmethod
    def from_dict(cls, d: JSONObject | None) -> TimingStats | None:
        return None if d is None else from_plain(cls, d, strict=False)


# -- what the judge recorded about how a result was obtained ---------------------------------


class TimingStop(enum.StrEnum):
    """Why a group's measurement stopped."""

    CI = "ci"  # every candidate's interval reached the target width
    AA_OFFSET = "aa_offset"  # every interval narrower than half the offset identical code showed (timer.precision_goal)
    TIME = "time"  # the group's time cap
    ROUNDS = "rounds"  # the round cap
    DEADLINE = "deadline"  # the evaluation's deadline
    FAILED = "failed"  # no candidate was left to time


class DeviceIdle(enum.StrEnum):
    """Whether the judge confirmed the device idle after every timed sample (`kernelrl.judge.timing.idle`)."""

    NOT_PROBED = "not_probed"  # a CPU: no probe (idle CPU and strays are checked instead)
    IDLE = "idle"
    BUSY = "busy"  # busy after a trusted member's samples, or past the drain: not paid
    UNCHECKED = "unchecked"  # the probe failed or could not be calibrated: not paid


class ReferenceWorker(enum.StrEnum):
    """Which process the reference was timed in."""

    PROGRAM = "program_worker"  # its copy, loaded as a program exactly as candidates are
    TASK = "task_worker"  # the worker that loaded the task (the copy failed its checks)


class ReviewAnswer(enum.StrEnum):
    """What the adversarial LLM judge said of a result."""

    REAL = "real"  # the model found no trick: no finding
    HACK = "hack"  # the model names a reward hack: `llm_judge`
    UNSURE = "unsure"  # the model could not tell, or its answer could not be read: a warning
    UNAVAILABLE = "unavailable"  # no answer at all (the endpoint kept failing): a warning, never cached


@dataclass(frozen=True, kw_only=True)
class Review:
    """One review of a result by the adversarial LLM judge (`kernelrl.checks.llm_judge`)."""

    answer: ReviewAnswer
    reason: str
    model: str
    cached: bool = False  # read from the cache: nothing was asked
    attempts: int = 0  # requests sent for this review (0 when cached)


@dataclass(frozen=True, kw_only=True)
class MachineRecord:
    """Where the group ran: threads, cores and the device's lock."""

    threads: int = 0  # threads each worker uses
    device_lock: str = ""  # the device's lock (cpu, cuda-0, ...): one measurement at a time on it
    timing_cores: tuple[int, ...] = ()  # cores every timed member was bound to ( (): unbound )
    # every timed worker said glibc took the pinned settings (heap only, from its timing pool on);
    # False where nothing was timed, the config turned it off, or there is no glibc mallopt
    pinned_allocator: bool = False
    proc_isolation: bool | None = None  # the task worker had a private /proc (None: not known)
    # fp32 precision: whether the evaluation allowed TF32, and the flags as the reference's worker
    # had them before any task code ran (the same are set in every candidate's worker)
    allow_tf32: bool = False
    # `object`, not JSONValue: `from_plain` follows field types, and passes an `object` value through
    # unchecked as it always has; a JSON union would be coerced option by option.
    precision: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class GroupPhases:
    """Where the group's wall time went, in seconds.

    Consecutive parts of the group's wall time: queued (waiting for a place among the groups
    judged at once), reference load, reference outputs, candidate checks, timing pool, timing (of
    which setup, samples and spot checks), verdict. The rest look
    inside them: the `candidate_*` and `*_checks_s` are summed over the group's trials, which run
    side by side (`EvalConfig.concurrency`), so they can add to more than `candidate_checks_s`; the
    task's own programs (its timed copy, the A/A copy: its trusted twin, `aa_tolerance`, and its
    compiled form) are checked as candidates are, each apart; the A/A copy's share of the timed
    rounds too; the stray checks are the census of every worker's processes around each exchange
    from the timing pool on (`Worker.end_strays`), inside the timing phases."""

    queued_s: float = 0.0  # before the group began: other groups held every place (`EvalConfig.concurrency`)
    reference_load_s: float = 0.0
    reference_outputs_s: float = 0.0
    candidate_checks_s: float = 0.0
    timing_pool_s: float = 0.0  # the timing pool made and sent to every member (beside other groups' checks)
    timing_s: float = 0.0  # the measurement, holding the device's lock; of which:
    timing_setup_s: float = 0.0  # warm-up
    timing_samples_s: float = 0.0  # the timed rounds
    timing_spot_checks_s: float = 0.0  # outputs and inputs fetched and compared
    verdict_s: float = 0.0  # verdicts assembled and handed over, workers closed
    candidate_worker_wait_s: float = 0.0  # waiting for a started worker from the pool
    candidate_loads_s: float = 0.0  # programs loaded: imports, builds (or a sealed build unpacked)
    candidate_correctness_s: float = 0.0  # models constructed, parameters copied, correctness runs
    timed_reference_checks_s: float = 0.0  # the reference loaded as a program to be timed: wait, load, correctness
    aa_copy_checks_s: float = 0.0  # the A/A copy's worker wait, load and correctness
    compiled_reference_checks_s: float = 0.0  # the reference under torch.compile (a baseline), likewise
    aa_copy_samples_s: float = 0.0  # the A/A copy's share of the timed rounds
    stray_checks_s: float = 0.0  # process census around every exchange, all the group's workers
    # waiting for the device's lock (its reference's load and outputs, each trial, the measurement):
    # on a CPU, checks and measurements exclude each other, so a group waits while another measures
    device_lock_wait_s: float = 0.0

    def describe(self) -> str:
        """The phases that took any time, one line: "reference_load 7.9, timing 21.9, ..." (s)."""
        return ", ".join(f"{f.name.removesuffix('_s')} {getattr(self, f.name):.1f}"
                         for f in fields(self) if getattr(self, f.name))


@dataclass(frozen=True, kw_only=True)
class ReferenceRecord:
    """The reference a candidate was compared with and timed against."""

    timed_in: ReferenceWorker = ReferenceWorker.PROGRAM
    copy_failed: str = ""  # why the reference's copy could not be timed ("" when it was)
    perturbed_sets: int = 0  # correctness sets that were scaled and shifted
    parameters_shared: bool | None = None  # the candidate was given the reference's parameters
    reseeded: bool = False  # the task's worker was kept from an earlier group, its model built again under a new seed
    sets_in_files: int = 0  # input sets (correctness and timing) the judge kept in files, not its heap (judge/spill.py)


@dataclass(frozen=True, kw_only=True)
class TimingRecord:
    """How the candidate's speedup was measured (`kernelrl.judge.timing.timer`)."""

    rounds: int = 0
    calls_per_sample: int = 1
    stopped_by: TimingStop = TimingStop.ROUNDS
    group_size: int = 0  # candidates timed together (the reference not counted)
    rel_ci_half_width: float = 0.0  # of this candidate's speedup
    wall_s: float = 0.0  # the group's measurement
    device_wait_s: float = 0.0  # waiting for the device's lock, over the evaluator's life
    spot_checks: int = 0
    spot_check_bytes: int = 0  # outputs the group's spot checks fetched from workers (inputs come as digests)
    # taken off the judge's clock: the exchange per sample, the per-call floor (the timing bracket
    # around nothing) per call (`kernelrl.judge.timing.timer`)
    exchange_ms: float = 0.0
    call_floor_ms: float = 0.0
    # the group's A/A pair (a copy of the reference timed as a member): its speedup, whether it
    # disagreed beyond the tolerance after every re-timing (noisy), and how often the group was
    # measured again; the band it measured is always in the result's noise_band
    aa_speedup: float | None = None
    noisy: bool = False
    retimed: int = 0
    # the judge's idle probe after every sample (`kernelrl.judge.timing.idle`): the group's state, and how
    # many of this candidate's samples left the device busy
    device_idle: DeviceIdle = DeviceIdle.NOT_PROBED
    device_busy: int = 0
    # cross-checks against the judge's clock and /proc (`kernelrl.checks.dynamic.timing_findings`)
    clock_excess_ms: float = 0.0
    prepare_excess_ms: float = 0.0
    prepare_allowed_ms: float = 0.0
    cand_idle_cpu_ms: float = 0.0
    ref_idle_cpu_ms: float = 0.0


@dataclass(frozen=True, kw_only=True)
class RooflineRecord:
    """The task's physical floors on this machine and the peaks they came from."""

    memory_floor_ms: float | None = None
    compute_floor_ms: float | None = None
    bandwidth_gbs: float | None = None
    tflops: float | None = None
    flops: float | None = None
    min_bytes: float | None = None
    peaks: str = ""  # where the peaks come from (measured, datasheet, demonstrated)
    error: str = ""  # why there is no roofline ("" when there is one)

    @property
    def floor_ms(self) -> float | None:
        """The tighter (larger) of the two floors."""
        known = [v for v in (self.memory_floor_ms, self.compute_floor_ms) if v]
        return max(known) if known else None


@dataclass(frozen=True, kw_only=True)
class Environment:
    """Everything the judge recorded about how a result was obtained, beside the verdict."""

    machine: MachineRecord | None = None
    phases: GroupPhases | None = None
    group: str = ""  # the timing group's id (results of one group share it and its phases); "" outside one
    cached: bool = False  # handed out again from the evaluator's result cache, not judged again
    reference: ReferenceRecord | None = None
    timing: TimingRecord | None = None
    roofline: RooflineRecord | None = None
    review: Review | None = None


@dataclass(kw_only=True)
class EvalResult:
    """The verdict on one candidate for one task."""

    task: str
    status: Status
    message: str = ""  # one line a person reads first
    speedup: float | None = None  # reference median / candidate median; CORRECT only
    speedup_ci: tuple[float, float] | None = None  # 95 % interval of the speedup
    # The speedups identical code measured on this task: the group's A/A copy, mirrored about 1,
    # widened by the task's calibration (`kernelrl calibrate`) where it has one; a speedup inside
    # it cannot be told from noise. CORRECT only.
    noise_band: tuple[float, float] | None = None
    ref_time: TimingStats | None = None
    cand_time: TimingStats | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    roofline_pct: float | None = None  # the candidate's share of the task's roofline on this machine; CORRECT only
    ref_roofline_pct: float | None = None  # the reference's share, measured in the same run
    build_time_s: float | None = None
    eval_time_s: float | None = None
    # the most device memory the candidate allocated in a correctness run (bytes); None on a CPU
    peak_device_bytes: int | None = None
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # compiler output, tracebacks, log tails
    environment: Environment = field(default_factory=Environment)
    device: str = "cpu"
    size: str = "small"
    policy: str = "open"
    candidate_hash: str = ""
    build_cached: bool = False
    # the evaluator config it was judged under (`kernelrl.judge.eval_config.config_fingerprint`);
    # a stored result is reused only under the same one
    config_fingerprint: str = ""
    containment: Containment = Containment.NONE  # how far the candidate's worker was contained
    timing: Timing = Timing.MEASURED  # INTERPRETED: outputs checked, times meaningless, never timed

    def __post_init__(self) -> None:
        if self.status is not Status.CORRECT and (self.speedup is not None or self.roofline_pct is not None):
            raise ValueError(f"speedup and roofline are only defined for correct candidates, not {self.status.value}")
        if self.timing is Timing.INTERPRETED and (self.speedup is not None or self.cand_time is not None):
            raise ValueError("an interpreted run has no speedup or times")

    @property
    def rejecting_rules(self) -> list[str]:
        return [f.rule for f in self.findings if f.severity is Severity.REJECT]

    def to_dict(self) -> JSONObject:
        return _plain_dict(self)

    @classmethod
    def from_dict(cls, d: JSONObject) -> EvalResult:
        if d.get("status") == Status.COMPILE_ERROR.value and d.get("message") == NO_CODE_MESSAGE:
            d = {**d, "status": Status.NO_CODE.value}  # stored by an older version under the old name
        return from_plain(cls, d, strict=False)

    @classmethod
    def no_code(cls, task: str, *, device: str = "cpu", size: str = "small", policy: str = "open",
                candidate_hash: str = NO_CODE_HASH) -> EvalResult:
        """The result of an answer without a complete code block: never judged, so it carries only
        the settings it would have been judged under."""
        return cls(task=task, status=Status.NO_CODE, message=NO_CODE_MESSAGE, device=device, size=size,
                   policy=policy, candidate_hash=candidate_hash)


def _plain_dict(record: object) -> JSONObject:
    plain = to_plain(record)
    assert isinstance(plain, dict)
    return plain
