"""Group timing: the reference and every candidate of a task, in one interleaved measurement.

Every round runs the reference and each surviving candidate once, in a fresh random order, on
the same fresh inputs (the judge picks a pool set and a scale per call), each call after a cache
eviction. A candidate's speedup is the median of its per-round ratios against that round's
reference sample, with a distribution-free 95 % interval; candidates of one group are measured
under the same conditions, and the reference is timed once for all of them.

Every sample is timed by the judge's own clock around the exchange, never by the worker's report:
a worker runs the candidate's code, which can reach and rewrite anything in its process,
including the list its harness records call times in. The exchange's own cost (pipe, wake-up,
reply) is taken off both sides of every ratio: its median over the reference's samples, where
the reference worker's reports (task code, trusted) give the judge's clock less the call time.
So is the per-call floor, once per call of a sample: what the worker's timing bracket costs
around nothing (synchronise, clock, synchronise, clock: on a GPU the device-wide synchronisation's
round trip), measured by `worker.call_floor_ns` in the reference's worker at warm-up; every member pays
it on every call whatever the call does, and left in, it pulls the ratios of sub-millisecond calls
toward 1. A kernel's own launch is not in the floor: it is the call's cost. Both are reported
(`GroupTiming.exchange_ms`, `call_floor_ms`), and the times the physical-floor check
(`impossible_speedup`) sees are net of both.
What workers report is still recorded and cross-checked against the judge's clock
(`timer_mismatch`): a forged report no longer pays, but it is still a hack to refuse.

Calls much shorter than `min_sample_ms` are timed in batches: a sample is `calls_per_sample`
calls, each on its own fresh inputs after its own (untimed) eviction, and the sample's time is
their mean, as triton's `do_bench` does for short kernels, so the +-1 % stop can fire within the
cap. Every member of a group uses the same number of calls per sample.

Guarantees:
- timing stops when every surviving candidate's interval has a relative half-width below
  `target_rel_ci` (after `min_rounds`, with `min_spot_checks` spot checks each), or below half the
  offset the A/A copy's interval establishes in the same measurement when that is wider
  (`precision_goal`: no number of rounds removes a process's own offset), or when the group's
  time cap (`max_timing_s` per candidate, for the group `max_timing_s * (members / 2)`) or
  `max_rounds` is reached;
- spot checks: after randomly chosen rounds (decided after the calls returned) the outputs of a
  candidate and of the reference for one call of that round's sample, also chosen after the
  calls returned, are compared, and the inputs each saw; each output is judged by its value when
  its call returned (the worker copies it, untimed, before the sample's next call), so a
  persistent output buffer overwritten by the next call (CUDA graphs' static output,
  torch.compile's reduce-overhead) is judged on its values and returning one storage every call
  is not itself a finding, while stale values in it (replay) are a mismatch; trusted members (the
  reference's copies, its compiled form) are not spot-checked. Every candidate gets
  at least `min_spot_checks` (10 by default) before timing may stop, so a program that skips (or
  replays) a fraction f of its calls passes them all with probability at most (1 - f)^10: 0.1 %
  for half its calls, 5.6 % for a quarter; a tenth (worth ~1.1x) may go unseen;
- a candidate that fails, hangs (past `call_limit_s`) or breaks the protocol during timing leaves
  the measurement with its failure recorded; the others go on; a failing reference ends the
  measurement (`ReferenceTimingFailed`);
- the judge records, from its own clock and from /proc, facts a worker cannot forge: the round
  trip of every sample, the CPU time each worker used while it was supposed to be idle, and its
  thread count around each call (`kernelrl.checks.dynamic.timing_findings` judges them);
- with an `IdleMonitor` (a GPU), the device is confirmed idle by the judge's own probe after
  every sample, and work left running is drained before the next member's sample
  (`kernelrl.judge.timing.idle`: what that does and does not see); the group's `device_idle` says
  whether it could be confirmed.

Does not interpret anything: it measures and records.
"""

from __future__ import annotations

import enum
import math
import random
import secrets
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from kernelrl.checks.dynamic import MemberTiming, TimingFacts
from kernelrl.judge.eval_config import TimingConfig  # declared with the other settings: no torch there
from kernelrl.judge.harness import protocol as P
from kernelrl.judge.harness.channel import ChannelProtocolError, ChannelTimeout
from kernelrl.judge.harness.compare import compare_outputs
from kernelrl.judge.isolation.exchange import Answer
from kernelrl.judge.isolation.sandbox import Worker, WorkerDied
from kernelrl.judge.timing.idle import IdleMonitor, IdleTally, device_state
from kernelrl.judge.timing.inputs import timing_scale
from kernelrl.result import DeviceIdle, TimingStop

_T = TypeVar("_T")

# How much faster than the reference a program's warm-up report is believed when sizing samples.
MAX_PLAUSIBLE_SPEEDUP = 100.0


class ReferenceTimingFailed(RuntimeError):
    """The reference failed during timing: no candidate of the group can be measured."""


class FailureKind(enum.StrEnum):
    """How a candidate left the measurement."""

    TIMEOUT = "timeout"  # a sample took longer than `call_limit_s`, or the deadline passed
    RUNTIME_ERROR = "runtime_error"  # it raised, crashed or exited
    PROTOCOL = "protocol"  # it broke the protocol (a forged or malformed answer)


@dataclass(frozen=True, kw_only=True)
class Failure:
    """Why a candidate left the measurement."""

    kind: FailureKind
    message: str
    log_tail: str = ""


@dataclass(kw_only=True)
class _Samples:
    """A member's samples, one entry per sample (`pairs`: per round it completed), in order."""

    ms: list[float] = field(default_factory=list)  # mean per call, as the worker reported
    round_trips_ns: list[int] = field(default_factory=list)  # the judge's clock around it
    # the judge's clock around the (untimed) preparation of its inputs and the eviction
    prepare_ns: list[int] = field(default_factory=list)
    # (the reference's round trip, this member's), judge's clock, ns
    pairs: list[tuple[int, int]] = field(default_factory=list)


@dataclass(kw_only=True)
class _Tally:
    """What the judge saw of a member beside its times: spot checks and their mismatches, threads
    (/proc) at warm-up and around each call, calls not made plainly, CPU time used while idle."""

    spot_checks: int = 0
    spot_mismatches: list[str] = field(default_factory=list)
    input_mismatches: int = 0
    threads_warm: int | None = None
    threads_seen: list[int] = field(default_factory=list)
    non_plain_calls: int = 0
    idle_cpu_ns: int = 0


@dataclass(kw_only=True)
class _Member:
    key: str | None  # the candidate's hash, the judge's name for a copy of the reference; None: the reference
    worker: Worker
    samples: _Samples = field(default_factory=_Samples)
    tally: _Tally = field(default_factory=_Tally)
    failure: Failure | None = None
    warm_ms: float = 0.0
    floor_ns: float = 0.0  # the per-call floor this member's worker measured (only the reference's is used)
    last_round_trip_ns: int = 0
    device: IdleTally = field(default_factory=IdleTally)  # the idle probe after its samples
    _idle_since_cpu: int | None = None

    def request(self, header: P.Header | None, kind: P.Kind | None = None, payload: object = None, *,
                deadline: float) -> Answer:
        """A command that also books the worker's CPU time since its last answer as idle."""
        now_cpu = self.worker.cpu_time_ns()
        if self._idle_since_cpu is not None and now_cpu is not None:
            self.tally.idle_cpu_ns += max(0, now_cpu - self._idle_since_cpu)
        if header is not None:
            answer = self.worker.request(header, payload, deadline=deadline)
        else:
            assert kind is not None
            answer = self.worker.command(kind, payload, deadline=deadline)
        # the judge's clock around the exchange alone (its own /proc reads stay outside)
        self.last_round_trip_ns = self.worker.last_exchange_ns
        self._idle_since_cpu = self.worker.cpu_time_ns()
        if answer.failed:
            raise _CallFailed(answer.header.message, answer.header.traceback)
        return answer


class _CallFailed(RuntimeError):
    def __init__(self, message: str, tb: str = ""):
        super().__init__(message)
        self.tb = tb


@dataclass(frozen=True, kw_only=True)
class CandidateTiming:
    """One candidate's share of a group measurement."""

    speedup: float | None  # None when it failed or has no rounds
    speedup_ci: tuple[float, float] | None
    rel_ci_half_width: float
    stopped_by: TimingStop
    times_ms: list[float]  # per call, by the judge's clock, net of the exchange's overhead
    facts: TimingFacts | None
    failure: Failure | None
    output_bytes: int


@dataclass(frozen=True, kw_only=True)
class GroupTiming:
    reference_ms: list[float]
    candidates: dict[str, CandidateTiming]
    rounds: int
    calls_per_sample: int
    stopped_by: TimingStop
    wall_s: float
    device_wait_s: float = 0.0  # how long the group waited for the device's lock (set by the group)
    # where the measurement's wall time went: warm-up (the pool went before: `send_pools`), rounds, spot checks (s)
    setup_s: float = 0.0
    samples_s: float = 0.0
    spot_checks_s: float = 0.0
    twin_samples_s: float = 0.0  # of the timed rounds, the A/A copy's samples (`twin`)
    spot_check_bytes: int = 0  # outputs and inputs fetched for spot checks
    exchange_ms: float = 0.0  # taken off every sample: the exchange's median cost (the reference's samples)
    call_floor_ms: float = 0.0  # taken off every call: the timing bracket around nothing (the reference's worker)
    # the group's A/A pair (set by the group): a copy of the reference timed as a member
    aa_speedup: float | None = None
    aa_ci: tuple[float, float] | None = None
    noisy: bool = False  # the A/A pair disagreed beyond the tolerance in every measurement of the group
    retimed: int = 0  # measurements repeated because the A/A pair disagreed
    device_idle: DeviceIdle = DeviceIdle.NOT_PROBED  # the idle probe after every sample (`kernelrl.judge.timing.idle`)
    device_note: str = ""  # why the device could not be confirmed idle ("" when it could)
    allocator_pinned: bool = False  # every member that took its pool said its allocator is pinned


def aa_noisy(aa: CandidateTiming | None, tolerance: float) -> bool:
    """Identical code disagreed: the A/A copy failed, or its 95 % interval lies wholly outside
    1 +- tolerance (a speedup of 1 / (1 + tolerance) to 1 + tolerance)."""
    if aa is None or aa.speedup is None or aa.speedup_ci is None:
        return True
    lo, hi = aa.speedup_ci
    return lo > 1.0 + tolerance or hi < 1.0 / (1.0 + tolerance)


def aa_band(timing: GroupTiming) -> tuple[float, float] | None:
    """What identical code measured in this group, as a band symmetric about 1 (in log): a speedup
    inside it cannot be told from this measurement's noise."""
    if timing.aa_speedup is None:
        return None
    values = [timing.aa_speedup, *(timing.aa_ci or ())]
    m = max(max(v, 1.0 / v) for v in values if v > 0)
    return (1.0 / m, m)


def precision_goal(config: TimingConfig, aa_ratios: Sequence[float]) -> float:
    """The relative half-width every member's interval must reach before timing may stop.

    `target_rel_ci`, unless the A/A copy (the reference's code in a process of its own, timed as a
    member) measured an offset from 1 that its own 95 % interval establishes (the interval excludes
    1): then `aa_precision_share` of that offset, when larger. Every member is timed in a process of
    its own, as the copy is, and a process keeps its offset for its whole life, so rounds narrow a
    member's interval around a ratio that is still off by about that much; an interval narrower
    than half of it resolves nothing that identical code would not also show, and the verdict
    pays a speedup inside the A/A band (`aa_band`) as noise anyway. The time goes instead to the
    group's next measurement: an offset beyond `EvalConfig.aa_tolerance` has the group retimed.
    """
    if config.aa_precision_share <= 0 or len(aa_ratios) < 3:
        return config.target_rel_ci
    speedup, lo, hi = median_ci(aa_ratios)
    if lo <= 1.0 <= hi:
        return config.target_rel_ci
    return max(config.target_rel_ci, config.aa_precision_share * (max(speedup, 1.0 / speedup) - 1.0))


def median_ci(ratios: Sequence[float]) -> tuple[float, float, float]:
    """Median of ratios and its distribution-free 95 % interval (order statistics of logs)."""
    logs = sorted(math.log(r) for r in ratios)
    n = len(logs)
    med = statistics.median(logs)
    half = 1.96 * math.sqrt(n) / 2
    lo_i = max(0, math.floor(n / 2 - half) - 1)
    hi_i = min(n - 1, math.ceil(n / 2 + half) - 1)
    return math.exp(med), math.exp(logs[lo_i]), math.exp(logs[hi_i])


def calls_per_sample(fastest_ms: float, input_bytes: int, config: TimingConfig) -> int:
    """How many calls one sample holds, so that the fastest member's sample lasts min_sample_ms."""
    if fastest_ms <= 0 or fastest_ms >= config.min_sample_ms:
        return 1
    k = math.ceil(config.min_sample_ms / fastest_ms)
    if input_bytes > 0:
        k = min(k, max(1, config.sample_input_bytes // input_bytes))
    return max(1, min(k, config.max_calls_per_sample))


def _nbytes(x: object) -> int:
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    numel, size = getattr(x, "numel", None), getattr(x, "element_size", None)
    return int(numel() * size()) if callable(numel) and callable(size) else 0


@dataclass(frozen=True, kw_only=True)
class PoolsSent:
    """The timing pool as every member took it (`send_pools`), before the measurement."""

    failed: dict[str, BaseException]  # candidates that could not take it (their workers were killed)
    pinned: tuple[bool, ...]  # each member's report that its allocator is pinned


def send_pools(reference: Worker, candidates: Mapping[str, Worker], pool: list[list[object]], config: TimingConfig,
               *, rng: random.Random, deadline: float) -> PoolsSent:
    """Give every member the timing pool, outside the measurement: on a CPU under the device's shared
    lock (it copies sets and draws their noise, work that needs no machine to itself), so other groups'
    checks go on meanwhile. The measurement that follows starts from its warm-up. A reference that
    cannot take it ends the measurement (`ReferenceTimingFailed`); a candidate that cannot is
    recorded and killed, and `measure_group` records its failure."""
    header = P.Pool(noise_seed=rng.getrandbits(31), jitter=config.jitter)
    failed: dict[str, BaseException] = {}
    pinned: list[bool] = []
    for key, worker in [(None, reference), *candidates.items()]:
        problem: BaseException | None = None
        try:
            pooled = worker.request(header, pool, deadline=min(deadline, time.monotonic() + config.call_limit_s))
            if pooled.failed:
                problem = _CallFailed(pooled.header.message, pooled.header.traceback)
            else:
                pinned.append(isinstance(pooled.header, P.Pooled) and pooled.header.allocator_pinned)
        except (ChannelTimeout, ChannelProtocolError, WorkerDied) as e:
            problem = e
        if problem is None:
            continue
        if key is None:
            raise ReferenceTimingFailed(f"the reference failed during timing: {problem}") from problem
        failed[key] = problem
        worker.kill()  # a hung or broken program must not keep the cores busy
    return PoolsSent(failed=failed, pinned=tuple(pinned))


def measure_group(reference: Worker, candidates: Mapping[str, Worker], pool: list[list[object]], sent: PoolsSent,
                  config: TimingConfig, *, rng: random.Random, deadline: float, tol_scale: float = 1.0, tf32: bool = False,
                  cores: frozenset[int] | None = None, idle: IdleMonitor | None = None,
                  trusted: frozenset[str] = frozenset(), twin: str | None = None) -> GroupTiming:
    """Time the reference and the candidates together (see the module docstring), from their
    warm-up: `sent` is the pool as each member took it (`send_pools`), a failure there its failure.

    `cores`: every member is bound to these cores for the measurement and unbound after it
    (`kernelrl.judge.isolation.sandbox.timing_cores`), so no member is faster for the core it runs on.
    `idle`: the device is probed after every sample (`kernelrl.judge.timing.idle`); `trusted`: the
    candidate keys whose programs are the task's own (the reference's copies), which count like
    the reference when the device is found busy after them; `twin`: the key of the member that runs
    the reference's own program (the A/A copy), whose record goes into every candidate's facts as
    the yardstick of what two processes running the same code differ by.
    """
    workers = [reference, *candidates.values()] if cores is not None else []
    for w in workers:
        w.bind(cores)
    try:
        return _measure(reference, candidates, pool, config, rng=rng, deadline=deadline, tol_scale=tol_scale,
                        tf32=tf32, idle=idle, trusted=trusted, twin=twin, sent=sent)
    finally:
        for w in workers:
            w.bind(None)


def _measure(reference: Worker, candidates: Mapping[str, Worker], pool: list[list[object]], config: TimingConfig,
             *, rng: random.Random, deadline: float, tol_scale: float, tf32: bool, idle: IdleMonitor | None,
             trusted: frozenset[str], twin: str | None, sent: PoolsSent) -> GroupTiming:
    t_start = time.monotonic()
    ref = _Member(key=None, worker=reference)
    cands = [_Member(key=k, worker=w) for k, w in candidates.items()]
    members = [ref, *cands]
    pair = next((m for m in cands if twin is not None and m.key == twin), None)  # the A/A copy

    def call_deadline() -> float:
        return min(deadline, time.monotonic() + config.call_limit_s)

    def fail(m: _Member, e: BaseException) -> None:
        if m is ref:
            raise ReferenceTimingFailed(f"the reference failed during timing: {e}") from e
        kind = (FailureKind.TIMEOUT if isinstance(e, ChannelTimeout) else FailureKind.PROTOCOL
                if isinstance(e, ChannelProtocolError) else FailureKind.RUNTIME_ERROR)
        tail = e.log_tail if isinstance(e, WorkerDied) else m.worker.log_tail()
        message = str(e) + (f"\n{e.tb}" if isinstance(e, _CallFailed) and e.tb else "")
        m.failure = Failure(kind=kind, message=message, log_tail=tail)
        m.worker.kill()  # a hung or broken program must not keep the cores busy

    def alive() -> list[_Member]:
        return [m for m in members if m.failure is None]

    def guarded(m: _Member, fn: Callable[[], _T]) -> _T | None:
        try:
            return fn()
        except (_CallFailed, ChannelTimeout, ChannelProtocolError, WorkerDied) as e:
            fail(m, e)
            return None

    # where the measurement's time went
    spent = {"setup_s": 0.0, "samples_s": 0.0, "spot_checks_s": 0.0, "twin_samples_s": 0.0}
    clock = time.monotonic()
    for m in cands:  # the pool went out before the measurement (`send_pools`)
        if m.key in sent.failed:
            fail(m, sent.failed[m.key])
    for m in alive():
        warm = guarded(m, partial(m.request, P.Warmup(calls=config.warmup_calls, max_s=config.warmup_max_s),
                                  deadline=call_deadline()))
        if warm is not None:
            m.warm_ms = warm.header.call_ms
            m.floor_ns = max(0.0, float(warm.header.floor_ns))
            m.tally.threads_warm = m.worker.thread_count()
    live = [m for m in alive() if m is not ref]
    calibrated = idle.start() if idle is not None else False
    # A program's warm-up time is its own report, which its code can forge (a clock standing still
    # reports 0 ms, which would make samples of one call, mostly exchange overhead): no member
    # counts as faster than MAX_PLAUSIBLE_SPEEDUP times the reference (trusted: the task's code).
    floor_ms = ref.warm_ms / MAX_PLAUSIBLE_SPEEDUP if ref.failure is None else 0.0
    k = calls_per_sample(min((max(m.warm_ms, floor_ms) for m in alive()), default=0.0), _nbytes(pool[0]), config)
    cap_s = config.max_timing_s * max(1.0, len(alive()) / 2)
    stop_at = min(deadline, time.monotonic() + cap_s)
    stopped_by = TimingStop.ROUNDS
    overheads_ns: list[int] = []  # the reference's samples: the judge's round trip less the reported time
    floor_ns = ref.floor_ns  # trusted: the task's own program's worker; the same for every member

    def taken_off() -> float:
        """What every sample pays beyond its calls: the exchange, and the floor once per call."""
        return (statistics.median(overheads_ns) if overheads_ns else 0.0) + k * floor_ns

    rounds = 0
    output_bytes = 0
    spent["setup_s"] = time.monotonic() - clock
    spot_bytes = 0
    for r in range(config.max_rounds):
        clock = time.monotonic()
        if cands and not live:
            stopped_by = TimingStop.FAILED
            break
        if not cands and rounds >= config.min_rounds:
            break  # the reference alone (an eager baseline): its own samples are the measurement
        index = rng.randrange(len(pool))
        scales = [timing_scale(rng) for _ in range(k)]
        shifts = [rng.getrandbits(30) for _ in range(k)]
        order = alive()
        rng.shuffle(order)
        round_rt: dict[int, int] = {}
        for m in order:
            def sample(m: _Member = m) -> int:
                m.request(P.Prepare(index=index, scales=scales, shifts=shifts), deadline=call_deadline())  # noqa: B023 - called at once, inside this round
                m.samples.prepare_ns.append(m.last_round_trip_ns)
                th = m.worker.thread_count()
                called = m.request(None, P.Kind.CALL, deadline=call_deadline())
                rt = m.last_round_trip_ns
                th_after = m.worker.thread_count()
                m.tally.threads_seen += [x for x in (th, th_after) if x is not None]
                times = called.header.t_ns
                if len(times) != k:
                    raise ChannelProtocolError(f"{len(times)} call times for a sample of {k}")
                m.samples.ms.append(sum(times) / len(times) / 1e6)
                m.samples.round_trips_ns.append(rt)
                if m is ref:
                    overheads_ns.append(rt - sum(times))
                if not called.header.plain:
                    m.tally.non_plain_calls += 1
                if idle is not None:  # after the worker's strays were ended, before the next member
                    idle.check(m.device)
                return rt

            asked = time.monotonic()
            got = guarded(m, sample)
            if m is pair:
                spent["twin_samples_s"] += time.monotonic() - asked
            if got is not None:
                round_rt[id(m)] = got
        rounds += 1
        live = [m for m in alive() if m is not ref]
        for m in live:
            m.samples.pairs.append((round_rt[id(ref)], round_rt[id(m)]))

        spent["samples_s"] += time.monotonic() - clock
        clock = time.monotonic()
        # Which rounds are checked is decided only now, after the calls returned.
        rounds_left = config.max_rounds - r - 1
        ref_outs: dict[int, tuple[object, str, P.Output]] = {}  # per call: the reference's output, inputs' digest, the ask
        # Trusted members (the reference's copies, its compiled form) are kernelrl's own code and no
        # verdict reads their outputs: fetching them bought nothing (7.6 s of a 44 s A/A group of
        # three trusted programs on the 2026-11-27 H100).
        checked = [m for m in live if m.key not in trusted]
        for m in rng.sample(checked, len(checked)):  # no member is always asked first
            must = m.tally.spot_checks < config.min_spot_checks and (
                r + 1 >= config.min_rounds or rounds_left < config.min_spot_checks)
            if not (must or rng.random() < config.spot_check_prob):
                continue
            # Any call of the sample, chosen now: a program cannot know which of its calls counts.
            call = rng.randrange(k)
            if call not in ref_outs:
                # The digest's key, like the call, exists only now (`fingerprint.keyed_digest`).
                ask = P.Output(call=call, key=secrets.randbits(63))
                answer = guarded(ref, lambda: ref.request(ask, deadline=call_deadline()))  # noqa: B023 - called at once, inside this iteration
                if answer is None:
                    break
                ref_outs[call] = (answer.payload["output"], answer.header.inputs_digest, ask)
                output_bytes = _nbytes(answer.payload["output"])
                spot_bytes += output_bytes
            ref_output, ref_inputs, ask = ref_outs[call]
            fetched = guarded(m, partial(m.request, ask, deadline=call_deadline()))
            if fetched is None:
                continue
            m.tally.spot_checks += 1
            spot_bytes += _nbytes(fetched.payload["output"])
            cmp = compare_outputs(fetched.payload["output"], ref_output, tol_scale=tol_scale, tf32=tf32)
            if not cmp.ok:
                m.tally.spot_mismatches.append(f"round {r}: {cmp.reason}")
            # The inputs as the call left them, by digest: the same staging made both members' (an
            # honest program's in-place write is what this catches; outputs are judged by value above).
            if fetched.header.inputs_digest != ref_inputs:
                m.tally.input_mismatches += 1
        live = [m for m in alive() if m is not ref]
        spent["spot_checks_s"] += time.monotonic() - clock

        if rounds >= config.min_rounds and live:
            overhead = taken_off()
            spotted = all(m.tally.spot_checks >= config.min_spot_checks for m in live if m.key not in trusted)
            goal = precision_goal(config, _ratios(pair.samples.pairs, overhead)
                                  if pair is not None and pair.failure is None else ())
            if spotted and all(_rel_half(_ratios(m.samples.pairs, overhead)) <= goal for m in live):
                stopped_by = TimingStop.CI if goal <= config.target_rel_ci else TimingStop.AA_OFFSET
                break
            if time.monotonic() >= stop_at and spotted:
                stopped_by = TimingStop.TIME
                break
        if time.monotonic() >= deadline:
            stopped_by = TimingStop.DEADLINE
            break

    results: dict[str, CandidateTiming] = {}
    ref_timing = _member_timing(ref, k)
    twin_timing = _member_timing(pair, k) if pair is not None and pair.failure is None else None
    overhead = taken_off()
    for key, m in zip(candidates, cands):  # cands were made from `candidates`, in its order
        if m.failure is not None or not m.samples.pairs:
            results[key] = CandidateTiming(speedup=None, speedup_ci=None, rel_ci_half_width=math.inf,
                                           stopped_by=TimingStop.FAILED, times_ms=_judged_ms(m, overhead, k),
                                           facts=None, failure=m.failure or Failure(kind=FailureKind.RUNTIME_ERROR,
                                                                        message="no timed round completed"),
                                           output_bytes=output_bytes)
            continue
        ratios = _ratios(m.samples.pairs, overhead)
        speedup, lo, hi = median_ci(ratios)
        facts = TimingFacts(candidate=_member_timing(m, k), reference=ref_timing,
                            twin=twin_timing if m is not pair else None, spot_checks=m.tally.spot_checks,
                            spot_mismatches=m.tally.spot_mismatches, input_mismatches=m.tally.input_mismatches)
        results[key] = CandidateTiming(speedup=speedup, speedup_ci=(lo, hi), rel_ci_half_width=_rel_half(ratios),
                                       stopped_by=stopped_by, times_ms=_judged_ms(m, overhead, k), facts=facts,
                                       failure=None,
                                       output_bytes=output_bytes)
    device_idle, device_note = DeviceIdle.NOT_PROBED, ""
    if idle is not None:
        device_idle = device_state(calibrated=calibrated, everyone=[m.device for m in members],
                                   trusted=[ref.device, *(m.device for m in cands if m.key in trusted)])
        device_note = idle.note
    return GroupTiming(reference_ms=_judged_ms(ref, overhead, k), candidates=results, rounds=rounds, calls_per_sample=k,
                       device_idle=device_idle, device_note=device_note,
                       setup_s=spent["setup_s"], samples_s=spent["samples_s"], spot_checks_s=spent["spot_checks_s"],
                       twin_samples_s=spent["twin_samples_s"], spot_check_bytes=spot_bytes, call_floor_ms=floor_ns / 1e6,
                       exchange_ms=(statistics.median(overheads_ns) if overheads_ns else 0.0) / 1e6,
                       stopped_by=stopped_by, wall_s=time.monotonic() - t_start,
                       allocator_pinned=bool(sent.pinned) and all(sent.pinned))


def _ratios(pairs: Sequence[tuple[int, int]], overhead_ns: float) -> list[float]:
    """Per-round speedups from the judge's clock, the exchange and the call floor taken off both."""
    return [_net(r, overhead_ns) / _net(c, overhead_ns) for r, c in pairs]


def _net(round_trip_ns: float, overhead_ns: float) -> float:
    # A sample lasts min_sample_ms (the overhead is a small part of it); the floor only keeps a
    # sample that came back faster than the median overhead from dividing by zero.
    return max(round_trip_ns - overhead_ns, 0.1 * round_trip_ns, 1.0)


def _judged_ms(m: _Member, overhead_ns: float, k: int) -> list[float]:
    """A member's per-call times by the judge's clock, net of the reference's exchange overhead."""
    return [_net(rt, overhead_ns) / k / 1e6 for rt in m.samples.round_trips_ns]


def _rel_half(ratios: Sequence[float]) -> float:
    if len(ratios) < 3:
        return math.inf
    _, lo, hi = median_ci(ratios)
    return (hi - lo) / 2 / statistics.median(ratios)


def _member_timing(m: _Member, k: int) -> MemberTiming:
    samples, tally = m.samples, m.tally
    return MemberTiming(times_ms=list(samples.ms), round_trips_ms=[rt / 1e6 / k for rt in samples.round_trips_ns],
                        prepare_ms=[p / 1e6 for p in samples.prepare_ns],
                        idle_cpu_ms=tally.idle_cpu_ns / 1e6, busy_ms=sum(samples.ms),
                        threads_warm=tally.threads_warm, threads_max=max(tally.threads_seen, default=None),
                        non_plain_calls=tally.non_plain_calls, device_busy=m.device.busy,
                        device_undrained=m.device.undrained, device_probes=m.device.probes)
