"""Verdicts: what a candidate's checks and measurements mean, decided without running anything.

Every function here is pure: records in (what a trial established, what the group's timing
measured, the task's floors on this machine, an LLM review), an `EvalResult` out. Nothing here
starts a worker, reads a file or asks a model, so every rule of the decision is tested with
records made by hand (tests/judge/timing/test_verdict.py).

The decision, in order:
- a trial that ended early (does not parse, does not build, crashed, wrong on an input set, a
  static rule) keeps its verdict; an `incorrect` one that a defence explains becomes `flagged`
  (the rule is what teaches the next prompt);
- a candidate that failed during timing is `timeout` or `runtime_error`, or `flagged`
  (`result_channel_forged`) when it broke the protocol;
- a crash or a hang (early or in timing) after a defence already refused the candidate is
  `flagged`: a hack that then fails is still a hack, and failing is no way to trade the hack
  penalty for a failure's smaller one;
- a timed candidate's findings are its trial's, the timing's cross-checks
  (`kernelrl.checks.dynamic.timing_findings`), the physical floor (`impossible_speedup`, from
  the task's floors at the measured peaks) and the LLM review's; the policy weighs every finding
  once; any finding that rejects makes it `flagged`, otherwise it is `correct` with its speedup,
  interval and roofline share;
- unless the group could not confirm the device idle after its samples (`kernelrl.judge.timing.idle`:
  busy after the reference's, or the probe failed): then what would be `correct` is a
  `judge_error` (not paid, not cached, judged again on the next try), since the reference's own
  times may hold work that was not its own;
- only a `correct` result carries a speedup or a roofline share.

Does not measure, and does not decide what a fact means for a rule: `kernelrl.checks.dynamic`
does; the policy (`kernelrl.checks.policy`) sets each rule's severity.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from kernelrl.checks import dynamic, llm_judge
from kernelrl.checks.dynamic import Floors
from kernelrl.checks.policy import PolicyName, get_policy
from kernelrl.judge.harness.profile import TaskProfile
from kernelrl.judge.timing.roofline import MachinePeaks, roofline_pct
from kernelrl.judge.timing.timer import CandidateTiming, FailureKind, GroupTiming
from kernelrl.result import (
    Containment,
    DeviceIdle,
    Environment,
    EvalResult,
    Finding,
    ReferenceRecord,
    Review,
    RooflineRecord,
    Severity,
    Status,
    Timing,
    TimingRecord,
    TimingStats,
)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """A verdict reached before timing: the status, one line for people, and the evidence."""

    status: Status
    message: str
    errors: tuple[str, ...] = ()  # compiler output, tracebacks, log tails
    max_abs_err: float | None = None  # an incorrect result's errors on the set it failed
    max_rel_err: float | None = None


@dataclass(frozen=True, kw_only=True)
class Setting:
    """What every result of an evaluator records about how it was judged."""

    task: str
    device: str
    size: str
    policy: PolicyName
    fingerprint: str  # of the evaluator's config (`kernelrl.judge.eval_config.config_fingerprint`)
    containment: Containment = Containment.NONE  # of the workers programs ran in


@dataclass(frozen=True, kw_only=True)
class Checked:
    """What a candidate's trial established before timing (`kernelrl.judge.trial`)."""

    candidate_hash: str
    findings: tuple[Finding, ...] = ()
    build_time_s: float | None = None
    build_cached: bool = False
    max_abs_err: float | None = None  # over the correctness sets
    max_rel_err: float | None = None
    parameters_shared: bool | None = None  # the reference's parameters were loaded into the candidate
    timing: Timing = Timing.MEASURED  # INTERPRETED: checked, never timed (its early verdict says so)
    peak_device_bytes: int | None = None  # the most its correctness runs allocated on a device; None on a CPU
    eval_time_s: float | None = None  # from the start of its checks to this decision


@dataclass(frozen=True, kw_only=True)
class Roofline:
    """The floors a task is held to on this machine, and the figures they come from."""

    peaks: MachinePeaks
    floors: Floors
    profile: TaskProfile

    def record(self) -> RooflineRecord:
        f, p = self.floors, self.profile
        return RooflineRecord(memory_floor_ms=f.memory_ms, compute_floor_ms=f.compute_ms,
                              bandwidth_gbs=self.peaks.bandwidth_gbs, tflops=f.tflops, flops=p.flops,
                              min_bytes=p.min_bytes, peaks=self.peaks.source)


def early(setting: Setting, checked: Checked, verdict: Verdict, environment: Environment) -> EvalResult:
    """The result of a trial that ended before timing."""
    env = _with_parameters(environment, checked)
    return _result(setting, checked, verdict, list(checked.findings), env)


def failed_in_timing(setting: Setting, checked: Checked, measured: CandidateTiming, timing: GroupTiming,
                     environment: Environment) -> EvalResult:
    """The result of a candidate that failed during the group's measurement."""
    failure = measured.failure
    assert failure is not None
    findings = list(checked.findings)
    status = Status.TIMEOUT if failure.kind is FailureKind.TIMEOUT else Status.RUNTIME_ERROR
    if failure.kind is FailureKind.PROTOCOL:
        findings.append(dynamic.channel_forged(_first_line(failure.message)))
        status = Status.FLAGGED
    verdict = Verdict(status=status, message=f"candidate failed during timing: {_first_line(failure.message)}",
                      errors=(failure.message, failure.log_tail))
    env = dataclasses.replace(_with_parameters(environment, checked), timing=_timing_record(measured, timing))
    return _result(setting, checked, verdict, findings, env, ref_time=_stats(timing.reference_ms))


def timed(setting: Setting, checked: Checked, measured: CandidateTiming, timing: GroupTiming, *,
          roofline: Roofline | None, roofline_error: str = "", review: Review | None = None,
          floor_slack: float = dynamic.FLOOR_SLACK, noise_band: tuple[float, float] | None = None,
          environment: Environment) -> EvalResult:
    """The result of a candidate timed to the end of its group's measurement."""
    assert measured.failure is None and measured.facts is not None and measured.speedup is not None
    findings = list(checked.findings)
    found, figures = dynamic.timing_findings(measured.facts)
    findings.extend(found)
    cand_ms = statistics.median(measured.times_ms)
    ref_ms = statistics.median(timing.reference_ms)
    record = dataclasses.replace(_timing_record(measured, timing), spot_checks=measured.facts.spot_checks,
                                 clock_excess_ms=figures.clock_excess_ms, prepare_excess_ms=figures.prepare_excess_ms,
                                 prepare_allowed_ms=figures.prepare_allowed_ms,
                                 cand_idle_cpu_ms=figures.cand_idle_cpu_ms, ref_idle_cpu_ms=figures.ref_idle_cpu_ms,
                                 device_busy=measured.facts.candidate.device_busy)
    env = dataclasses.replace(_with_parameters(environment, checked), timing=record, review=review)
    cand_pct = ref_pct = None
    if roofline is not None:
        beyond = dynamic.impossible_speedup(cand_ms, roofline.floors, slack=floor_slack)
        if beyond is not None:
            findings.append(beyond)
        cand_pct, ref_pct = roofline_pct(cand_ms, roofline.floors), roofline_pct(ref_ms, roofline.floors)
        env = dataclasses.replace(env, roofline=roofline.record())
    elif roofline_error:
        env = dataclasses.replace(env, roofline=RooflineRecord(error=roofline_error))
    review_finding = review_to_finding(review)
    if review_finding is not None:
        findings.append(review_finding)
    result = _result(setting, checked, None, findings, env, ref_time=_stats(timing.reference_ms),
                     cand_time=_stats(measured.times_ms), speedup=measured.speedup, speedup_ci=measured.speedup_ci,
                     noise_band=noise_band, roofline_pct=cand_pct, ref_roofline_pct=ref_pct)
    if result.status is Status.CORRECT and timing.device_idle in (DeviceIdle.BUSY, DeviceIdle.UNCHECKED):
        why = timing.device_note or ("the device was busy after the reference's samples, or past the judge's wait"
                                     if timing.device_idle is DeviceIdle.BUSY else "the idle probe did not answer")
        verdict = Verdict(status=Status.JUDGE_ERROR, message=(
            f"the device could not be confirmed idle during the measurement ({why}): not paid; judged again "
            "on the next try"))
        return _result(setting, checked, verdict, findings, env, ref_time=_stats(timing.reference_ms),
                       cand_time=_stats(measured.times_ms))
    return result


def beyond_floor(measured: CandidateTiming, roofline: Roofline, *, floor_slack: float) -> bool:
    """Whether a timed candidate is faster than the floors allow (before the peaks are re-checked)."""
    if not measured.times_ms:
        return False
    return dynamic.impossible_speedup(statistics.median(measured.times_ms), roofline.floors,
                                      slack=floor_slack) is not None


def degenerate(setting: Setting, candidate_hash: str, reasons: Sequence[str], environment: Environment) -> EvalResult:
    """Every candidate of a task whose reference ignores its inputs: flagged, nothing paid."""
    finding = dynamic.degenerate_task(reasons)
    assert finding is not None
    verdict = Verdict(status=Status.FLAGGED, message=f"flagged: degenerate_task ({'; '.join(reasons)})")
    return _result(setting, Checked(candidate_hash=candidate_hash), verdict, [finding], environment)


def task_error(setting: Setting, candidate_hash: str, error: str, environment: Environment) -> EvalResult:
    """The task's reference failed: no verdict on the candidate at all."""
    return EvalResult(task=setting.task, status=Status.TASK_ERROR, message=_first_line(error), errors=[error],
                      device=setting.device, size=setting.size, policy=setting.policy,
                      candidate_hash=candidate_hash, environment=environment, config_fingerprint=setting.fingerprint,
                      containment=setting.containment)


def review_to_finding(review: Review | None) -> Finding | None:
    """An LLM review as a finding (`kernelrl.checks.llm_judge.finding`), when it names a problem."""
    return llm_judge.finding(review)


# ---------------------------------------------------------------------------------------------


# Verdicts a rejecting finding turns into `flagged`. A compile error stays one: nothing ran.
_REFUSED_WHEN_FOUND = frozenset({Status.INCORRECT, Status.CORRECT, Status.RUNTIME_ERROR, Status.TIMEOUT})


def _result(setting: Setting, checked: Checked, verdict: Verdict | None, findings: list[Finding],
            environment: Environment, *, ref_time: TimingStats | None = None, cand_time: TimingStats | None = None,
            speedup: float | None = None, speedup_ci: tuple[float, float] | None = None,
            noise_band: tuple[float, float] | None = None, roofline_pct: float | None = None,
            ref_roofline_pct: float | None = None) -> EvalResult:
    """The result, with the policy applied to every finding once."""
    weighed = get_policy(setting.policy).apply(findings)
    rejecting = sorted({f.rule for f in weighed if f.severity is Severity.REJECT})
    if verdict is None:
        if rejecting:
            verdict = Verdict(status=Status.FLAGGED, message=f"flagged: {', '.join(rejecting)}",
                              errors=tuple(f.message for f in weighed if f.severity is Severity.REJECT))
        else:
            assert speedup is not None
            verdict = Verdict(status=Status.CORRECT, message=f"correct, {speedup:.3g}x")
    elif verdict.status in _REFUSED_WHEN_FOUND and rejecting:
        # Wrong, and a defence saw why: the rule is what teaches the next prompt. Correct without
        # timing (an interpreted run) but with a rejecting finding: refused as well. Crashed or hung
        # after a defence refused it: flagged, or a program could fail on purpose once caught.
        verdict = dataclasses.replace(verdict, status=Status.FLAGGED,
                                      message=f"flagged: {', '.join(rejecting)} ({verdict.message})")
    correct = verdict.status is Status.CORRECT
    return EvalResult(
        task=setting.task, status=verdict.status, message=verdict.message,
        speedup=speedup if correct else None, speedup_ci=speedup_ci if correct else None,
        noise_band=noise_band if correct else None,
        ref_time=ref_time, cand_time=cand_time,
        max_abs_err=verdict.max_abs_err if verdict.max_abs_err is not None else checked.max_abs_err,
        max_rel_err=verdict.max_rel_err if verdict.max_rel_err is not None else checked.max_rel_err,
        roofline_pct=roofline_pct if correct else None, ref_roofline_pct=ref_roofline_pct,
        build_time_s=checked.build_time_s, eval_time_s=checked.eval_time_s, findings=weighed,
        errors=[e for e in verdict.errors if e], environment=environment, device=setting.device, size=setting.size,
        policy=setting.policy, candidate_hash=checked.candidate_hash, build_cached=checked.build_cached,
        config_fingerprint=setting.fingerprint, containment=setting.containment, timing=checked.timing,
        peak_device_bytes=checked.peak_device_bytes)


def _timing_record(measured: CandidateTiming, timing: GroupTiming) -> TimingRecord:
    return TimingRecord(rounds=timing.rounds, calls_per_sample=timing.calls_per_sample,
                        stopped_by=measured.stopped_by, group_size=len(timing.candidates),
                        rel_ci_half_width=measured.rel_ci_half_width, wall_s=round(timing.wall_s, 3),
                        device_wait_s=round(timing.device_wait_s, 3), spot_check_bytes=timing.spot_check_bytes,
                        exchange_ms=timing.exchange_ms, call_floor_ms=timing.call_floor_ms,
                        aa_speedup=timing.aa_speedup, noisy=timing.noisy, retimed=timing.retimed,
                        device_idle=timing.device_idle)


def _with_parameters(environment: Environment, checked: Checked) -> Environment:
    if checked.parameters_shared is None:
        return environment
    reference = environment.reference or ReferenceRecord()
    return dataclasses.replace(environment, reference=dataclasses.replace(
        reference, parameters_shared=checked.parameters_shared))


def _stats(samples_ms: Sequence[float]) -> TimingStats | None:
    return TimingStats.from_samples_ms(list(samples_ms)) if samples_ms else None


def _first_line(text: str) -> str:
    for line in (text or "").strip().splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""
