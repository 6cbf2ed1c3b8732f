"""The verdict, decided from records alone: no worker is started in this file."""

from __future__ import annotations

import time

import pytest

from kernelrl.checks import rules as R
from kernelrl.checks.dynamic import Floors, MemberTiming, TimingFacts
from kernelrl.checks.policy import PolicyName
from kernelrl.judge.harness.profile import TaskProfile
from kernelrl.judge.timing import verdict as V
from kernelrl.judge.timing.roofline import MachinePeaks
from kernelrl.judge.timing.timer import CandidateTiming, Failure, FailureKind, GroupTiming
from kernelrl.result import (
    Environment,
    Finding,
    ReferenceRecord,
    Review,
    ReviewAnswer,
    Severity,
    Status,
    TimingStop,
)

SETTING = V.Setting(task="t", device="cpu", size="small", policy=PolicyName.OPEN, fingerprint="fp")
ENV = Environment(reference=ReferenceRecord(perturbed_sets=4))


def honest(ms: float, n: int = 20) -> MemberTiming:
    return MemberTiming(times_ms=[ms] * n, round_trips_ms=[ms + 0.05] * n, idle_cpu_ms=0.0, busy_ms=ms * n,
                        threads_warm=2, threads_max=2, prepare_ms=[1.0] * n)


def measured(speedup: float, *, cand_ms: float = 1.0, facts: TimingFacts | None = None,
             failure: Failure | None = None) -> CandidateTiming:
    facts = facts or TimingFacts(candidate=honest(cand_ms), reference=honest(cand_ms * speedup), spot_checks=3)
    return CandidateTiming(speedup=None if failure else speedup, speedup_ci=None if failure else (speedup * 0.99,
                                                                                                  speedup * 1.01),
                           rel_ci_half_width=0.01, stopped_by=TimingStop.FAILED if failure else TimingStop.CI,
                           times_ms=[cand_ms] * 20, facts=None if failure else facts, failure=failure, output_bytes=64)


def group(m: CandidateTiming, ref_ms: float) -> GroupTiming:
    return GroupTiming(reference_ms=[ref_ms] * 20, candidates={"c": m}, rounds=20, calls_per_sample=1,
                       stopped_by=TimingStop.CI, wall_s=1.5, device_wait_s=0.25)


def checked(*findings: Finding) -> V.Checked:
    return V.Checked(candidate_hash="c", findings=findings, build_time_s=0.0, max_abs_err=1e-6, max_rel_err=1e-6,
                     parameters_shared=True, eval_time_s=3.0)


def roofline(memory_ms: float) -> V.Roofline:
    peaks = MachinePeaks(device="cpu", name="test", threads=1, bandwidth_gbs=10.0, fp32_tflops=0.1, bf16_tflops=None,
                         source="measured", measured_at=time.time())
    profile = TaskProfile(task="t", size="small", constants={}, inputs=["float32[250]"], init_args=[], outputs=[],
                          flops=0, input_bytes=1000, output_bytes=0, param_bytes=0, dtype="float32")
    return V.Roofline(peaks=peaks, floors=Floors(memory_ms=memory_ms, compute_ms=None), profile=profile)


def test_a_clean_timed_candidate_is_correct_with_its_speedup_and_records():
    m = measured(2.0)
    res = V.timed(SETTING, checked(), m, group(m, 2.0), roofline=None, environment=ENV)
    assert res.status is Status.CORRECT and res.speedup == 2.0 and res.speedup_ci == (1.98, 2.02)
    assert res.message == "correct, 2x" and res.config_fingerprint == "fp"
    timing = res.environment.timing
    assert timing is not None and timing.rounds == 20 and timing.stopped_by is TimingStop.CI
    assert timing.spot_checks == 3 and timing.device_wait_s == 0.25
    assert res.environment.reference == ReferenceRecord(perturbed_sets=4, parameters_shared=True)
    assert res.ref_time is not None and res.ref_time.median_ms == 2.0 and res.cand_time.median_ms == 1.0


def test_a_rejecting_finding_from_the_trial_flags_a_fast_candidate():
    m = measured(5.0)
    found = Finding(rule=R.OUTPUT_CACHED_ACROSS_CALLS, message="cached")
    res = V.timed(SETTING, checked(found), m, group(m, 5.0), roofline=None, environment=ENV)
    assert res.status is Status.FLAGGED and res.speedup is None and res.roofline_pct is None
    assert R.OUTPUT_CACHED_ACROSS_CALLS in res.rejecting_rules and "cached" in res.errors


def test_the_policy_weighs_findings_once():
    # a static rule only warns under observe; a dynamic defence rejects under every policy
    m = measured(5.0)
    static = Finding(rule=R.FORWARD_REBINDING, message="rebinds forward", stage="static")
    observe = V.Setting(task="t", device="cpu", size="small", policy=PolicyName.OBSERVE, fingerprint="fp")
    res = V.timed(observe, checked(static), m, group(m, 5.0), roofline=None, environment=ENV)
    assert res.status is Status.CORRECT and res.findings[0].severity is Severity.WARN
    res = V.timed(SETTING, checked(static), m, group(m, 5.0), roofline=None, environment=ENV)
    assert res.status is Status.FLAGGED
    dynamic = Finding(rule=R.OUTPUT_CACHED_ACROSS_CALLS, message="cached")
    res = V.timed(observe, checked(dynamic), m, group(m, 5.0), roofline=None, environment=ENV)
    assert res.status is Status.FLAGGED


def test_faster_than_the_memory_floor_is_impossible():
    m = measured(50.0, cand_ms=0.01)
    res = V.timed(SETTING, checked(), m, group(m, 0.5), roofline=roofline(memory_ms=0.1), environment=ENV)
    assert res.status is Status.FLAGGED and R.IMPOSSIBLE_SPEEDUP in res.rejecting_rules
    assert res.environment.roofline is not None and res.environment.roofline.memory_floor_ms == 0.1
    assert V.beyond_floor(m, roofline(memory_ms=0.1), floor_slack=0.5)


def test_within_the_floor_a_result_carries_its_roofline_share():
    m = measured(2.0, cand_ms=0.4)
    res = V.timed(SETTING, checked(), m, group(m, 0.8), roofline=roofline(memory_ms=0.1), environment=ENV)
    assert res.status is Status.CORRECT and res.roofline_pct == pytest.approx(25.0)
    assert res.ref_roofline_pct == pytest.approx(12.5)


def test_no_peaks_is_said_in_the_record_not_guessed():
    m = measured(2.0)
    res = V.timed(SETTING, checked(), m, group(m, 2.0), roofline=None, roofline_error="no peaks here",
                  environment=ENV)
    assert res.roofline_pct is None and res.environment.roofline is not None
    assert res.environment.roofline.error == "no peaks here"


def test_a_hack_review_flags_under_strict_warns_under_open_and_an_unsure_one_warns():
    m = measured(4.0)
    hack = Review(answer=ReviewAnswer.HACK, reason="side stream", model="m")
    strict = V.Setting(task="t", device="cpu", size="small", policy=PolicyName.STRICT, fingerprint="fp")
    res = V.timed(strict, checked(), m, group(m, 4.0), roofline=None, review=hack, environment=ENV)
    assert res.status is Status.FLAGGED and R.LLM_JUDGE in res.rejecting_rules
    assert res.environment.review == hack
    res = V.timed(SETTING, checked(), m, group(m, 4.0), roofline=None, review=hack, environment=ENV)
    assert res.status is Status.CORRECT and [f.rule for f in res.findings] == [R.LLM_JUDGE]
    unsure = Review(answer=ReviewAnswer.UNSURE, reason="cannot tell", model="m")
    res = V.timed(SETTING, checked(), m, group(m, 4.0), roofline=None, review=unsure, environment=ENV)
    assert res.status is Status.CORRECT and [f.rule for f in res.findings] == [R.LLM_JUDGE_UNSURE]


def test_a_forged_clock_is_caught_by_the_timing_cross_check():
    liar = MemberTiming(times_ms=[0.001] * 20, round_trips_ms=[1.0] * 20, idle_cpu_ms=0.0, busy_ms=0.02,
                        threads_warm=2, threads_max=2, prepare_ms=[1.0] * 20)
    m = measured(2.0, facts=TimingFacts(candidate=liar, reference=honest(2.0), spot_checks=3))
    res = V.timed(SETTING, checked(), m, group(m, 2.0), roofline=None, environment=ENV)
    assert res.status is Status.FLAGGED and R.TIMER_MISMATCH in res.rejecting_rules
    assert res.environment.timing is not None and res.environment.timing.clock_excess_ms > 0.5


@pytest.mark.parametrize(("kind", "status", "rule"), [
    (FailureKind.TIMEOUT, Status.TIMEOUT, None),
    (FailureKind.RUNTIME_ERROR, Status.RUNTIME_ERROR, None),
    (FailureKind.PROTOCOL, Status.FLAGGED, R.RESULT_CHANNEL_FORGED),
])
def test_failing_during_timing(kind, status, rule):
    m = measured(2.0, failure=Failure(kind=kind, message="it broke\nmore", log_tail="tail"))
    res = V.failed_in_timing(SETTING, checked(), m, group(m, 2.0), ENV)
    assert res.status is status and res.speedup is None and res.message.endswith("it broke")
    assert "tail" in res.errors
    assert (rule in res.rejecting_rules) if rule else not res.rejecting_rules


@pytest.mark.parametrize("kind", [FailureKind.TIMEOUT, FailureKind.RUNTIME_ERROR])
def test_a_candidate_refused_before_timing_that_then_fails_in_timing_stays_flagged(kind):
    m = measured(2.0, failure=Failure(kind=kind, message="fork: resource temporarily unavailable", log_tail=""))
    caught = Finding(rule=R.SIDE_WORK_AFTER_RETURN, message="5 calls returned with new child processes")
    res = V.failed_in_timing(SETTING, checked(caught), m, group(m, 2.0), ENV)
    assert res.status is Status.FLAGGED and res.rejecting_rules == [R.SIDE_WORK_AFTER_RETURN]
    assert "failed during timing" in res.message  # what happened is still said


def test_a_crash_after_a_defence_refused_the_candidate_is_flagged():
    crashed = V.Verdict(status=Status.RUNTIME_ERROR, message="candidate raised: boom")
    assert V.early(SETTING, checked(), crashed, ENV).status is Status.RUNTIME_ERROR
    found = Finding(rule=R.INPUTS_MUTATED, message="mutated")
    assert V.early(SETTING, checked(found), crashed, ENV).status is Status.FLAGGED


def test_an_incorrect_candidate_a_defence_explains_becomes_flagged():
    wrong = V.Verdict(status=Status.INCORRECT, message="incorrect on input set 2", errors=("off",), max_abs_err=3.0)
    res = V.early(SETTING, checked(), wrong, ENV)
    assert res.status is Status.INCORRECT and res.max_abs_err == 3.0 and res.errors == ["off"]
    found = Finding(rule=R.INPUTS_MUTATED, message="mutated")
    res = V.early(SETTING, checked(found), wrong, ENV)
    assert res.status is Status.FLAGGED and res.message.startswith(f"flagged: {R.INPUTS_MUTATED}")


def test_a_compile_error_stays_one_whatever_warns():
    broken = V.Verdict(status=Status.COMPILE_ERROR, message="candidate does not build")
    res = V.early(SETTING, checked(Finding(rule=R.INPUTS_MUTATED, message="m")), broken, ENV)
    assert res.status is Status.COMPILE_ERROR and res.speedup is None


def test_a_degenerate_task_flags_every_candidate_and_a_task_error_pays_nothing():
    res = V.degenerate(SETTING, "c", ["all zeros"], ENV)
    assert res.status is Status.FLAGGED and res.rejecting_rules == [R.DEGENERATE_TASK]
    res = V.task_error(SETTING, "c", "the reference hangs\ndetails", ENV)
    assert res.status is Status.TASK_ERROR and res.message == "the reference hangs" and res.speedup is None


def test_results_round_trip_through_plain_json():
    m = measured(2.0, cand_ms=0.4)
    res = V.timed(SETTING, checked(), m, group(m, 0.8), roofline=roofline(memory_ms=0.1), environment=ENV)
    back = type(res).from_dict(res.to_dict())
    assert back == res
