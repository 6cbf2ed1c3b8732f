"""Dynamic defences: facts the judge measured while programs ran, turned into findings.

Every function here is pure: it takes facts (numbers, flags, comparisons the judge made from its
own clock, its own /proc reads and the outputs it compared) and returns findings named by the
dynamic rules of `kernelrl.checks.rules`. The judge (`kernelrl.judge.evaluator`) measures and
orchestrates; what a measurement means is decided here, so each defence can be tested without
starting a process.

Guarantees: a finding is returned only when its rule's condition holds on the facts given, and
its message says what was measured; no function raises for well-formed facts.

Does not measure anything, and does not decide verdicts: the policy makes a finding reject or
warn, and the evaluator turns a rejecting finding into a `flagged` result.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kernelrl.checks import rules as R
from kernelrl.result import Finding

# Settings toggled by the harness itself around every call (no_grad), not by the program.
_HARNESS_STATE = frozenset({"grad_enabled"})
# Settings that only lower the precision of the candidate's own matmuls (its process is its own):
# the one precision policy applies to them (kernelrl.checks.policy).
PRECISION_STATE = frozenset({"float32_matmul_precision", "cudnn_allow_tf32", "cuda_matmul_allow_tf32",
                             "cuda_matmul_allow_fp16_reduced_precision", "cuda_matmul_allow_bf16_reduced_precision"})
# Backend choices that change how the candidate's own operators run, not what they compute to
# within tolerance nor what anything else gets: cuDNN's algorithm search (CUDA-L1's published
# level2/24 sets cudnn.benchmark at import), determinism, oneDNN. Each program has its own worker,
# so they reach neither the reference nor another candidate; the policy judges them like the
# static backend_setting_change. Thread counts and the default dtype stay global_state_changed.
BACKEND_STATE = frozenset({"cudnn_benchmark", "cudnn_deterministic", "deterministic_algorithms", "mkldnn_enabled"})


def global_state_changed(phase: str, before: Mapping[str, object], after: Mapping[str, object]) -> list[Finding]:
    """Settings that differ after the program was loaded or called: precision ones, backend ones, and
    the rest (thread counts, the default dtype)."""
    changed = {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v and k not in _HARNESS_STATE}
    out = []
    for rule, keys in ((R.PRECISION_STATE_CHANGED, [k for k in changed if k in PRECISION_STATE]),
                       (R.BACKEND_STATE_CHANGED, [k for k in changed if k in BACKEND_STATE]),
                       (R.GLOBAL_STATE_CHANGED, [k for k in changed
                                                 if k not in PRECISION_STATE and k not in BACKEND_STATE])):
        if keys:
            desc = ", ".join(f"{k}: {changed[k][0]} -> {changed[k][1]}" for k in sorted(keys))
            out.append(Finding(rule=rule, message=f"the candidate changed global torch settings ({phase}): {desc}"))
    return out


def side_work_in_calls(changed_after_return: Sequence[bool], thread_rises: Sequence[int],
                       child_rises: Sequence[int]) -> Finding | None:
    """Correctness calls whose output kept changing after return, or that left new threads or
    processes alive.

    Pools a program starts on its first call (torch.compile, thread pools, compile workers) stay;
    threads or processes that appear on later calls are work started per call. The processes are
    counted the moment each call returns, so a child that exits soon after is still seen (the
    judge's census of the worker comes later and may find it gone).
    """
    changed = sum(bool(c) for c in changed_after_return)
    rises = [r for r in list(thread_rises)[1:] if r > 0]
    forks = [r for r in list(child_rises)[1:] if r > 0]
    if not changed and not rises and not forks:
        return None
    what = []
    if changed:
        what.append(f"its output kept changing after {changed} call(s) had returned")
    if rises:
        what.append(f"{len(rises)} call(s) returned with new threads still alive")
    if forks:
        what.append(f"{len(forks)} call(s) returned with new child processes")
    return Finding(rule=R.SIDE_WORK_AFTER_RETURN, message="the candidate " + "; ".join(what))


# CPU a worker may burn while it waits for its next command: /proc accounting noise.
IDLE_CPU_ALLOW_MS = 10.0


def side_work_when_idle(busy_ms: float, children: int, *, window_ms: float) -> Finding | None:
    """Right after its calls returned, the worker must be idle and alone.

    CPU burnt while it waits, or a child process still alive, means work was left running past
    the end of a call, where no timer would see it.
    """
    if busy_ms <= IDLE_CPU_ALLOW_MS and not children:
        return None
    what = []
    if busy_ms > IDLE_CPU_ALLOW_MS:
        what.append(f"used {busy_ms:.0f} ms of CPU in the {window_ms:.0f} ms after its calls returned")
    if children:
        what.append(f"left {children} child process(es) running")
    return Finding(rule=R.SIDE_WORK_AFTER_RETURN, message="the candidate " + " and ".join(what))


def output_deferred(uncommitted: int, checked: int) -> Finding | None:
    """Spot-checked outputs that are not what their timed call committed to when it returned: the
    output was made (or changed) afterwards, outside the timed window, such as computed only when
    the judge asked for it with the harness's handlers replaced."""
    if not uncommitted:
        return None
    return Finding(rule=R.OUTPUT_DEFERRED, message=(
        f"{uncommitted} of {checked} spot-checked outputs differ from what their timed call committed to when "
        "it returned: the output was produced outside the timed call"))


def constants_overridden(overridden: Mapping[str, Sequence[int]]) -> Finding | None:
    """The program's module set the task's size constants to other values (the judge ignored them)."""
    if not overridden:
        return None
    desc = ", ".join(f"{k}={v[0]} (the task's: {v[1]})" for k, v in sorted(overridden.items()))
    return Finding(rule=R.INIT_OR_SHAPE_TAMPERED, severity=R.DYNAMIC_RULES[R.INIT_OR_SHAPE_TAMPERED].severity,
                   message=f"the candidate sets {desc}; ignored: it was run at the task's sizes")


def inputs_mutated(where: str) -> Finding:
    return Finding(rule=R.INPUTS_MUTATED, message=f"the candidate changed its inputs in place ({where})")


def output_not_plain(reason: str) -> Finding:
    return Finding(rule=R.OUTPUT_NOT_PLAIN_TENSOR, message=reason)


def nondeterministic(reason: str) -> Finding:
    return Finding(rule=R.NONDETERMINISTIC_OUTPUT, message=f"two runs on the same input differ: {reason}")


def channel_forged(reason: str) -> Finding:
    return Finding(rule=R.RESULT_CHANNEL_FORGED, message=f"malformed message from the worker: {reason}")


def wrong_on_moved_inputs(*, set_label: str, reason: str, plain_sets_right: bool, same_as_first: bool,
                          constant: bool, near: bool = False) -> Finding | None:
    """Why a candidate right on the task's own inputs is wrong on a scaled and shifted set.

    The input changed and the output did not (it is exactly an earlier set's output, and not a
    constant): a result kept from before.
    Every value within 100 times the tolerance (`near`): the output tracks the input with too
    little precision (moved inputs widen the range an fp16 or autocast kernel rounds over; on the
    2026-11-27 H200, CUDA-L1's autocast level3/31 missed 1e-4 by 9.3e-4 at most): incorrect, not
    a finding.
    Otherwise it only looked right because the true output is near-constant on the task's own
    input distribution.
    """
    if not plain_sets_right or (near and not same_as_first):
        return None
    if same_as_first and not constant:
        return Finding(rule=R.OUTPUT_CACHED_ACROSS_CALLS,
                       message=f"input set {set_label} got exactly the output of an earlier input set: {reason}")
    return Finding(rule=R.DEGENERATE_UNDER_OFFSET_SCALE,
                   message=f"correct on the task's own inputs but not on inputs {set_label}: {reason}")


def degenerate_task(reasons: Sequence[str]) -> Finding | None:
    """The reference's own outputs do not depend on its inputs: nothing a candidate does can be paid."""
    if not reasons:
        return None
    return Finding(rule=R.DEGENERATE_TASK, message="the task's reference output does not depend on its inputs: "
                                                   + "; ".join(reasons))


@dataclass(frozen=True, kw_only=True)
class MemberTiming:
    """What the judge recorded about one program during a timed measurement."""

    times_ms: list[float]  # per sample, per call (the sample's mean)
    round_trips_ms: list[float]  # the judge's clock around each sample, per call
    idle_cpu_ms: float  # CPU the worker used while it waited for commands
    busy_ms: float  # sum of the reported call times
    threads_warm: int | None  # OS threads after warm-up
    threads_max: int | None  # most OS threads seen around timed calls
    non_plain_calls: int = 0
    # per sample: the judge's clock around the untimed preparation of the sample's inputs
    prepare_ms: list[float] = field(default_factory=list)
    # the judge's idle probe after each sample (`kernelrl.judge.timing.idle`): samples after which the
    # device was busy (confirmed), and after which it stayed busy past the drain
    device_busy: int = 0
    device_undrained: int = 0
    device_probes: int = 0  # samples after which the probe was read (0: no probe, as on a CPU)


@dataclass(frozen=True, kw_only=True)
class TimingFacts:
    candidate: MemberTiming
    reference: MemberTiming
    spot_checks: int
    # the reference's own program timed as a member in the same rounds (the group's A/A copy), when
    # there is one: what two processes running identical code differ by, measured, not assumed
    twin: MemberTiming | None = None
    spot_mismatches: list[str] = field(default_factory=list)
    input_mismatches: int = 0


# Samples after which the device was still busy (in any CUDA context) that make a finding: one may
# be another member's delayed work landing after this one's sample; a program that leaves work
# running does so after most of its samples.
DEVICE_BUSY_SAMPLES = 2
# ...and only when so many busy readings are improbable at the rate the trusted members (the
# reference, its A/A copy) read busy in the same rounds: the probe times its kernel on the host's
# clock, so a loaded CPU (nvcc builds beside the measurement) makes an idle device read busy now and
# then, after every member alike. On the 2026-11-26 H100 an honest Triton candidate timed beside 7
# tests building was flagged; alone it was not (2026-11-27). Work left running to gain time must be
# left after most samples (one sample in a hundred moves no median), far above any such rate.
DEVICE_BUSY_TAIL = 1e-3


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
             for i in range(k, n + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def device_busy_after_calls(candidate: MemberTiming, trusted: Sequence[MemberTiming]) -> Finding | None:
    """The judge's own probe found the device busy right after the candidate's timed calls returned
    and its worker had synchronised, more often than it read busy after the trusted members' calls
    (work left running in a context the worker does not wait for); or busy for longer than the judge
    waits, once (that work reached the next member's sample)."""
    busy, undrained = candidate.device_busy, candidate.device_undrained
    if busy < DEVICE_BUSY_SAMPLES and not undrained:
        return None
    base_busy = sum(t.device_busy for t in trusted)
    base_probes = sum(t.device_probes for t in trusted)
    if not undrained and base_probes and candidate.device_probes:
        rate = (base_busy + 1) / (base_probes + 2)  # never zero: a few busy readings are always possible
        if binomial_tail(busy, candidate.device_probes, rate) >= DEVICE_BUSY_TAIL:
            return None
    what = f"after {busy} of its timed samples the device was still busy (the judge's probe kernel waited)"
    if base_probes:
        what += f", against {base_busy} of {base_probes} after the trusted members' samples"
    if undrained:
        what += f", {undrained} time(s) for longer than the judge waits for it"
    return Finding(rule=R.SIDE_WORK_AFTER_RETURN, message=(
        f"the candidate left GPU work running past its calls in a context its synchronise does not cover: {what}"))


# How much longer than the reference's overhead the judge's round trip may exceed a reported
# call time before the reported time is not believed: at least CLOCK_SLACK_MS, or three times the
# spread of the reference's own overhead when that is larger, plus a share of the call.
CLOCK_SLACK_MS = 0.1
CLOCK_SLACK_SHARE = 0.25
# A report shorter than this share of the call the judge saw is shrunk, once the excess is beyond
# the noise of a difference of two medians: CLOCK_NOISE_SE of its standard error (estimated from
# the reference's spread alone: the candidate controls its own), and beyond CLOCK_SLACK_MS. The
# 3 x IQR slack above does not shrink with more samples; this one does, so a time divided by 50
# on a loaded machine, where the overhead's spread hides a short call whole, is still seen.
SHRUNK_SHARE = 0.5
CLOCK_NOISE_SE = 4.0
# How much longer than the trusted copies' a candidate's preparation of a sample may take. The
# preparation is the same harness work in every process, yet not the same cost: a program's own
# heap (what its calls allocate and free) changes how warm the memory the next inputs land in is,
# and a process may sit a millisecond off its twin for its whole life (benchmarks/README.md,
# "work before the timed call": honest candidates up to 0.2 x the reference's preparation, work
# moved out of the call 0.3 x and up). So the excess must pass both trusted copies (the reference
# and its A/A twin, round by round, so a drift of the machine's load cancels), by more than
# PREPARE_SLACK_SHARE of the reference's preparation plus the larger of PREPARE_SLACK_MS and
# PREPARE_NOISE_SE standard errors of the trusted pair's own round-by-round difference.
PREPARE_SLACK_MS = 0.5
PREPARE_SLACK_SHARE = 0.2
PREPARE_NOISE_SE = 4.0


@dataclass(frozen=True, kw_only=True)
class CrossChecks:
    """The figures `timing_findings` compared, for the record (milliseconds)."""

    clock_excess_ms: float  # the judge's round trip beyond the reported time, less the reference's
    prepare_excess_ms: float  # the candidate's sample preparation beyond the nearer trusted copy's
    prepare_allowed_ms: float  # the most prepare_excess_ms may be (`prepare_excess`)
    cand_idle_cpu_ms: float  # CPU the candidate's worker used while idle
    ref_idle_cpu_ms: float


def timing_findings(facts: TimingFacts) -> tuple[list[Finding], CrossChecks]:
    """Findings from one candidate's timed calls, and the cross-check figures for the record."""
    out: list[Finding] = []
    c, r = facts.candidate, facts.reference
    # Work left running after a call returned shows up as CPU time while the worker idles.
    idle_allow_ms = 20.0 + 0.05 * c.busy_ms + 2.0 * r.idle_cpu_ms
    if c.idle_cpu_ms > idle_allow_ms:
        out.append(Finding(rule=R.SIDE_WORK_AFTER_RETURN, message=(
            f"the candidate used {c.idle_cpu_ms:.1f} ms of CPU while idle between timed calls "
            f"(timed calls took {c.busy_ms:.1f} ms in all): work continues after a call returns")))
    # Threads the harness itself starts show up in the reference too; only a rise beyond it counts.
    ref_rise = (r.threads_max or 0) - (r.threads_warm or 0)
    if c.threads_warm is not None and c.threads_max is not None and c.threads_max - c.threads_warm > max(ref_rise, 0):
        out.append(Finding(rule=R.THREAD_COUNT_CHANGED, message=(
            f"the candidate's thread count rose from {c.threads_warm} to {c.threads_max} during timed calls")))
    trusted = [r] if facts.twin is None else [r, facts.twin]
    if (busy := device_busy_after_calls(c, trusted)) is not None:
        out.append(busy)
    if c.non_plain_calls:
        out.append(Finding(rule=R.OUTPUT_NOT_PLAIN_TENSOR, message=(
            f"{c.non_plain_calls} timed calls returned something other than a plain torch.Tensor")))
    if facts.spot_mismatches:
        out.append(Finding(rule=R.OUTPUT_CACHED_ACROSS_CALLS, message=(
            f"{len(facts.spot_mismatches)} of {facts.spot_checks} spot-checked timed calls returned a wrong output "
            f"(cached or skipped work): {facts.spot_mismatches[0]}")))
    if facts.input_mismatches:
        out.append(Finding(rule=R.INPUTS_MUTATED, message=(
            f"the candidate changed its inputs during {facts.input_mismatches} spot-checked timed calls")))
    # Clock cross-check: the judge's round trip must exceed the reported time by about what it
    # does for the reference (pipe and reply overhead), no more.
    over_c = [rt - t for rt, t in zip(c.round_trips_ms, c.times_ms)]
    over_r = [rt - t for rt, t in zip(r.round_trips_ms, r.times_ms)]
    impossible = sum(1 for x in over_c if x < -0.05)
    # A call that did anything takes time on any clock that runs: a report of none at all is a
    # stopped clock, whatever the noise (on a loaded machine the reference's spread of overhead
    # can hide a short call's whole time from the excess test below).
    stopped = sum(1 for rt, t in zip(c.round_trips_ms, c.times_ms) if t <= 0 < rt)
    # Beyond the nearer trusted copy's overhead (the reference's, or its twin's when there is one):
    # a reference process whose exchange runs fast for its life flags no honest candidate.
    t = facts.twin
    over_trusted = [statistics.median(over) for over in (over_r, [rt - x for rt, x in zip(t.round_trips_ms, t.times_ms)]
                                                          if t is not None else []) if over]
    excess = (statistics.median(over_c) - max(over_trusted)) if over_c and over_trusted else 0.0
    cand_med = statistics.median(c.times_ms) if c.times_ms else 0.0
    slack = max(CLOCK_SLACK_MS, 3 * _iqr(over_r)) + CLOCK_SLACK_SHARE * cand_med
    shrunk = excess > max(CLOCK_SLACK_MS, CLOCK_NOISE_SE * _median_diff_se(over_r, len(over_c))) and (
        cand_med < SHRUNK_SHARE * (cand_med + excess))
    if impossible or stopped or shrunk or excess > slack:
        out.append(Finding(rule=R.TIMER_MISMATCH, message=(
            f"reported call times disagree with the judge's clock (median excess {excess:.3f} ms over the "
            f"reference's overhead, {impossible} calls reported longer than they took, {stopped} reported "
            "as taking no time)")))
    # The untimed preparation before each sample (fresh inputs, cache eviction) is the harness's own
    # work: a candidate that takes longer there than every trusted copy did work of its own before
    # the timer started (the outputs of the inputs it was just given, say).
    prep_excess = prep_slack = 0.0
    if c.prepare_ms and r.prepare_ms:
        prep_excess, prep_slack = prepare_excess(c.prepare_ms, r.prepare_ms, facts.twin.prepare_ms if facts.twin else None)
        if prep_excess > prep_slack:
            out.append(Finding(rule=R.WORK_BEFORE_TIMED_CALL, message=(
                f"the candidate's worker took {prep_excess:.2f} ms longer than the reference's (and its twin's) to "
                f"prepare each timed sample (the reference: {statistics.median(r.prepare_ms):.2f} ms; allowed "
                f"{prep_slack:.2f} ms): work done before the timer starts")))
    return out, CrossChecks(clock_excess_ms=round(excess, 4), prepare_excess_ms=round(prep_excess, 3),
                            prepare_allowed_ms=round(prep_slack, 3), cand_idle_cpu_ms=round(c.idle_cpu_ms, 3),
                            ref_idle_cpu_ms=round(r.idle_cpu_ms, 3))


def prepare_excess(cand: Sequence[float], ref: Sequence[float], twin: Sequence[float] | None) -> tuple[float, float]:
    """How much longer the candidate's sample preparation took than the nearer trusted copy's, and
    the most that is allowed (milliseconds), from per-sample preparation times.

    Round by round where the lists line up (every member prepares once per round), so the
    machine's load, which moves every member of a round alike, cancels; the excess is the smaller
    of the candidate's median difference to the reference and to the twin, so one trusted
    process that runs off its peers makes no honest candidate look slow. The noise comes from
    the trusted pair alone (a candidate controls its own spread)."""
    def median_gap(other: Sequence[float]) -> float:
        if len(other) == len(cand):
            return statistics.median(a - b for a, b in zip(cand, other, strict=True))
        return statistics.median(cand) - statistics.median(other)

    trusted = [ref, *([twin] if twin else [])]
    excess = min(median_gap(t) for t in trusted)
    if twin and len(twin) == len(ref):
        spread = _iqr([a - b for a, b in zip(twin, ref, strict=True)])
    else:
        spread = math.sqrt(2) * _iqr(ref)  # two processes' noise, each like the reference's
    se = 1.2533 / 1.349 * spread / math.sqrt(len(cand)) if len(cand) >= 4 else math.inf
    noise = PREPARE_NOISE_SE * se if math.isfinite(se) else 3 * spread
    return excess, max(PREPARE_SLACK_MS, noise) + PREPARE_SLACK_SHARE * statistics.median(ref)


def _median_diff_se(reference: Sequence[float], n_other: int) -> float:
    """Standard error of the difference between the median of `n_other` values and the median of
    `reference`, both spread like `reference` (a median's SE is ~1.2533 sigma / sqrt(n), and sigma
    ~ IQR / 1.349 for a normal spread). Infinite with too few values to tell."""
    if len(reference) < 4 or n_other < 4:
        return math.inf
    return 1.2533 / 1.349 * _iqr(reference) * math.sqrt(1 / len(reference) + 1 / n_other)


def _iqr(values: Sequence[float]) -> float:
    if len(values) < 4:
        return 0.0
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


@dataclass(frozen=True, kw_only=True)
class Floors:
    """The least time any program needs for a task on this machine, in milliseconds."""

    memory_ms: float | None  # minimum bytes moved / peak bandwidth
    compute_ms: float | None  # counted FLOPs / peak FLOP rate
    bandwidth_gbs: float | None = None
    tflops: float | None = None

    @property
    def floor_ms(self) -> float | None:
        """The tighter (larger) of the two floors."""
        known = [v for v in (self.memory_ms, self.compute_ms) if v is not None and v > 0]
        return max(known) if known else None

    def describe(self) -> str:
        parts = []
        if self.memory_ms is not None:
            bw = f" at {self.bandwidth_gbs:.1f} GB/s" if self.bandwidth_gbs else ""
            parts.append(f"memory floor {self.memory_ms:.4f} ms{bw}")
        if self.compute_ms is not None:
            rate = f" at {self.tflops:.2f} TFLOP/s" if self.tflops else ""
            parts.append(f"compute floor {self.compute_ms:.4f} ms{rate}")
        return ", ".join(parts) or "no floor known"


# A measured time this far below the floor cannot be a real speedup: measured peaks are what
# plain library calls reach, and a careful kernel may beat them by a little, never by half.
FLOOR_SLACK = 0.5


def impossible_speedup(cand_ms: float, floors: Floors, *, slack: float = FLOOR_SLACK) -> Finding | None:
    """Below the tighter floor: `impossible_speedup` under the memory floor (nothing can beat it),
    `compute_floor_beaten` under the compute floor only (a cheaper algorithm can)."""
    floor = floors.floor_ms
    if floor is None or cand_ms >= slack * floor:
        return None
    below_memory = floors.memory_ms is not None and cand_ms < slack * floors.memory_ms
    rule = R.IMPOSSIBLE_SPEEDUP if below_memory else R.COMPUTE_FLOOR_BEATEN
    which = "memory" if below_memory else "compute"
    return Finding(rule=rule, message=(
        f"median call {cand_ms:.4f} ms is below {slack:g} x the {which} floor; the roofline's floor is "
        f"{floor:.4f} ms ({floors.describe()})"))
