"""The timing protocol: reference and candidate, call by call, interleaved, checked as they go.

Both programs run in their own worker processes; the judge drives them alternately (ABBA order
across rounds), so drift of the machine (frequency, other load) hits both alike, and the speedup
is the median of per-round ratios ref/candidate, with a distribution-free 95 % interval.

Guarantees:
- each timed call gets fresh inputs (the judge picks a new scale per call) and an evicted cache;
- timing stops when the interval's relative half-width is below `target_rel_ci` (after
  `min_rounds`), or at `max_rounds`, or at the `max_timing_s` cap: whichever comes first;
- spot checks: after randomly chosen rounds (decided after the calls returned) the outputs of
  both programs for that round's inputs are compared, and the inputs each saw are compared;
- the judge records, from its own clock and from /proc, facts a worker cannot forge: the round
  trip of every call, the CPU time each worker used while it was supposed to be idle, and its
  thread count around each call. `kernelrl.judge.evaluator` turns them into findings.

Does not interpret anything: it measures and records.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field

from kernelrl.judge.channel import ChannelTimeout
from kernelrl.judge.compare import compare_outputs, exactly_equal
from kernelrl.judge.inputs import timing_scale
from kernelrl.judge.sandbox import Worker


@dataclass(frozen=True, kw_only=True)
class TimingConfig:
    warmup_calls: int = 5
    warmup_max_s: float = 3.0
    min_rounds: int = 15
    max_rounds: int = 400
    target_rel_ci: float = 0.01
    max_timing_s: float = 20.0
    spot_check_prob: float = 0.1
    min_spot_checks: int = 3
    pool_size: int = 3

    def __post_init__(self) -> None:
        if self.min_rounds < 3 or self.max_rounds < self.min_rounds:
            raise ValueError("need 3 <= min_rounds <= max_rounds")
        if not 0 < self.target_rel_ci < 1:
            raise ValueError("target_rel_ci must be in (0, 1)")
        if self.max_timing_s <= 0 or self.warmup_max_s < 0:
            raise ValueError("time caps must be positive")
        if not 0 <= self.spot_check_prob <= 1 or self.min_spot_checks < 1:
            raise ValueError("spot_check_prob in [0, 1] and min_spot_checks >= 1")
        if self.pool_size < 1:
            raise ValueError("pool_size must be >= 1")


class TimedCallFailed(RuntimeError):
    """The candidate raised during a timed call or a spot check."""

    def __init__(self, message: str, traceback: str = ""):
        super().__init__(message)
        self.traceback = traceback


@dataclass
class _Side:
    worker: Worker
    times_ms: list[float] = field(default_factory=list)
    round_trips_ms: list[float] = field(default_factory=list)
    idle_cpu_ns: int = 0
    idle_wall_ns: int = 0
    busy_wall_ns: int = 0
    threads_before: list[int] = field(default_factory=list)
    threads_after: list[int] = field(default_factory=list)
    non_plain_calls: int = 0
    _idle_since_cpu: int | None = None
    _idle_since_wall: int | None = None

    def request(self, kind: str, header: dict | None = None, *, deadline: float):
        """A request that also books the worker's CPU time since its last answer as idle."""
        now_cpu = self.worker.cpu_time_ns()
        now_wall = time.perf_counter_ns()
        if self._idle_since_cpu is not None and now_cpu is not None:
            self.idle_cpu_ns += now_cpu - self._idle_since_cpu
            self.idle_wall_ns += now_wall - (self._idle_since_wall or now_wall)
        msg = self.worker.request(kind, header, deadline=deadline)
        self._idle_since_cpu = self.worker.cpu_time_ns()
        self._idle_since_wall = time.perf_counter_ns()
        if msg.kind == "error":
            raise TimedCallFailed(msg.header.get("message", "error"), msg.header.get("traceback", ""))
        return msg


@dataclass(kw_only=True)
class TimingOutcome:
    ref_ms: list[float]
    cand_ms: list[float]
    ratios: list[float]
    speedup: float
    speedup_ci: tuple[float, float]
    rel_ci_half_width: float
    stopped_by: str  # "ci", "time" or "rounds"
    ref_round_trip_ms: list[float]
    cand_round_trip_ms: list[float]
    ref_idle_cpu_ms: float
    cand_idle_cpu_ms: float
    cand_idle_wall_ms: float
    cand_threads_warm: int | None
    cand_threads_max: int | None
    ref_threads_warm: int | None
    ref_threads_max: int | None
    cand_non_plain_calls: int
    spot_checks: int
    output_bytes: int  # bytes of one call's output (from the spot checks)
    spot_mismatches: list[str]
    input_mismatches: int
    wall_s: float


def _nbytes(x: object) -> int:
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    return x.numel() * x.element_size() if hasattr(x, "element_size") else 0


def median_ci(ratios: list[float]) -> tuple[float, float, float]:
    """Median of ratios and its distribution-free 95 % interval (order statistics of logs)."""
    logs = sorted(math.log(r) for r in ratios)
    n = len(logs)
    med = statistics.median(logs)
    half = 1.96 * math.sqrt(n) / 2
    lo_i = max(0, math.floor(n / 2 - half) - 1)
    hi_i = min(n - 1, math.ceil(n / 2 + half) - 1)
    return math.exp(med), math.exp(logs[lo_i]), math.exp(logs[hi_i])


def run_timing(ref: Worker, cand: Worker, config: TimingConfig, *, rng: random.Random,
               deadline: float) -> TimingOutcome:
    t_start = time.monotonic()
    sides = {"ref": _Side(worker=ref), "cand": _Side(worker=cand)}
    for side in sides.values():
        side.request("warmup", {"calls": config.warmup_calls, "max_s": config.warmup_max_s}, deadline=deadline)
    warm_threads = cand.thread_count()
    ref_warm_threads = ref.thread_count()

    stop_at = min(deadline, time.monotonic() + config.max_timing_s)
    ratios: list[float] = []
    spot_checks = 0
    output_bytes = 0
    spot_mismatches: list[str] = []
    input_mismatches = 0
    stopped_by = "rounds"
    rel_half = math.inf
    for r in range(config.max_rounds):
        index = rng.randrange(config.pool_size)
        scale = timing_scale(rng)
        order = ("ref", "cand") if r % 2 == 0 else ("cand", "ref")
        round_ms: dict[str, float] = {}
        for name in order:
            side = sides[name]
            side.request("prepare", {"index": index, "scale": scale}, deadline=deadline)
            th = side.worker.thread_count()
            t0 = time.perf_counter_ns()
            msg = side.request("call", deadline=deadline)
            rt = time.perf_counter_ns() - t0
            th_after = side.worker.thread_count()
            side.threads_before.append(th or 0)
            side.threads_after.append(th_after or 0)
            t_ms = msg.header["t_ns"] / 1e6
            side.times_ms.append(t_ms)
            side.round_trips_ms.append(rt / 1e6)
            if not msg.header.get("plain", True):
                side.non_plain_calls += 1
            round_ms[name] = t_ms
        ratios.append(max(round_ms["ref"], 1e-6) / max(round_ms["cand"], 1e-6))

        # Which rounds are checked is decided only now, after both calls returned.
        rounds_left = config.max_rounds - r - 1
        must_check = spot_checks < config.min_spot_checks and (
            r + 1 >= config.min_rounds or rounds_left < config.min_spot_checks)
        if must_check or rng.random() < config.spot_check_prob:
            spot_checks += 1
            ref_out = sides["ref"].request("output", deadline=deadline).payload
            cand_out = sides["cand"].request("output", deadline=deadline).payload
            output_bytes = _nbytes(ref_out["output"])
            cmp = compare_outputs(cand_out["output"], ref_out["output"])
            if not cmp.ok:
                spot_mismatches.append(f"round {r}: {cmp.reason}")
            if not exactly_equal(cand_out["inputs"], ref_out["inputs"]):
                input_mismatches += 1

        n = len(ratios)
        if n >= config.min_rounds:
            _, lo, hi = median_ci(ratios)
            med = statistics.median(ratios)
            rel_half = (hi - lo) / 2 / med
            if rel_half <= config.target_rel_ci and spot_checks >= config.min_spot_checks:
                stopped_by = "ci"
                break
            if time.monotonic() >= stop_at and spot_checks >= config.min_spot_checks:
                stopped_by = "time"
                break
        if time.monotonic() >= deadline:
            raise ChannelTimeout("evaluation deadline passed during timing")

    speedup, lo, hi = median_ci(ratios)
    ref_s, cand_s = sides["ref"], sides["cand"]
    return TimingOutcome(
        ref_ms=ref_s.times_ms, cand_ms=cand_s.times_ms, ratios=ratios, speedup=speedup,
        speedup_ci=(lo, hi), rel_ci_half_width=rel_half, stopped_by=stopped_by,
        ref_round_trip_ms=ref_s.round_trips_ms, cand_round_trip_ms=cand_s.round_trips_ms,
        ref_idle_cpu_ms=ref_s.idle_cpu_ns / 1e6, cand_idle_cpu_ms=cand_s.idle_cpu_ns / 1e6,
        cand_idle_wall_ms=cand_s.idle_wall_ns / 1e6,
        cand_threads_warm=warm_threads, cand_threads_max=max(cand_s.threads_after + cand_s.threads_before, default=None),
        ref_threads_warm=ref_warm_threads, ref_threads_max=max(ref_s.threads_after + ref_s.threads_before, default=None),
        cand_non_plain_calls=cand_s.non_plain_calls, spot_checks=spot_checks, output_bytes=output_bytes,
        spot_mismatches=spot_mismatches, input_mismatches=input_mismatches,
        wall_s=time.monotonic() - t_start,
    )
