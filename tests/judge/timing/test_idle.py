"""The idle check after every timed sample (`kernelrl.judge.timing.idle`): the decision with fake probes on
any machine, the CUDA probe itself on a GPU (marked gpu). The known-bad program it exists for is
tests/fixtures/redteam/second_context_cuda.py (tests/checks/test_redteam.py)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from kernelrl.checks import rules as R
from kernelrl.checks.dynamic import MemberTiming, TimingFacts, timing_findings
from kernelrl.checks.policy import PolicyName
from kernelrl.judge.timing import idle as I
from kernelrl.judge.timing import verdict as V
from kernelrl.judge.timing.timer import CandidateTiming, GroupTiming
from kernelrl.plain import from_plain
from kernelrl.result import DeviceIdle, Environment, Status, TimingRecord, TimingStop

pytestmark = pytest.mark.xdist_group("cpu_judge")  # see conftest.py

SETTING = V.Setting(task="t", device="cuda", size="small", policy=PolicyName.OPEN, fingerprint="fp")
ENV = Environment()

IDLE_MS = 0.02
BUSY_MS = 3.0  # a time slice behind another context's work


class FakeProbe:
    """Answers from a script of latencies (ms); an exception in the script is raised."""

    def __init__(self, script: Iterable[float | Exception], then: float = IDLE_MS) -> None:
        self.script = list(script)
        self.then = then
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        got = self.script.pop(0) if self.script else self.then
        if isinstance(got, Exception):
            raise got
        return got


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def honest(ms: float, *, device_busy: int = 0, n: int = 20, probes: int = 0, undrained: int = 0) -> MemberTiming:
    return MemberTiming(times_ms=[ms] * n, round_trips_ms=[ms + 0.05] * n, idle_cpu_ms=0.0, busy_ms=ms * n,
                        threads_warm=2, threads_max=2, prepare_ms=[1.0] * n, device_busy=device_busy,
                        device_probes=probes, device_undrained=undrained)


def measured(speedup: float, *, device_busy: int = 0) -> CandidateTiming:
    facts = TimingFacts(candidate=honest(1.0, device_busy=device_busy), reference=honest(speedup), spot_checks=3)
    return CandidateTiming(speedup=speedup, speedup_ci=(speedup * 0.99, speedup * 1.01), rel_ci_half_width=0.01,
                           stopped_by=TimingStop.CI, times_ms=[1.0] * 20, facts=facts, failure=None, output_bytes=64)


def in_group(m: CandidateTiming, state: DeviceIdle) -> GroupTiming:
    return GroupTiming(reference_ms=[2.0] * 20, candidates={"c": m}, rounds=20, calls_per_sample=1,
                       stopped_by=TimingStop.CI, wall_s=1.5, device_idle=state)


def checked() -> V.Checked:
    return V.Checked(candidate_hash="c", max_abs_err=1e-6, max_rel_err=1e-6)


def monitor(script: Iterable[float | Exception], then: float = IDLE_MS) -> tuple[I.IdleMonitor, FakeProbe]:
    probe = FakeProbe([IDLE_MS] * I.CALIBRATION_PROBES + list(script), then=then)
    clock = FakeClock()
    m = I.IdleMonitor(probe, sleep=clock.sleep, clock=clock)
    assert m.start()
    return m, probe


# -- calibration and the threshold ------------------------------------------------------------


def test_the_threshold_is_a_multiple_of_the_idle_time_and_at_least_a_margin_above_it():
    fast = I.calibrate([0.02] * 21)
    assert fast is not None and fast.idle_ms == 0.02
    assert fast.threshold_ms == pytest.approx(0.02 + I.BUSY_MARGIN_MS)  # the margin dominates
    slow = I.calibrate([0.2] * 21)
    assert slow is not None and slow.threshold_ms == pytest.approx(I.BUSY_FACTOR * 0.2)  # the factor dominates


def test_a_probe_exactly_at_the_threshold_is_idle_and_just_above_it_busy():
    cal = I.calibrate([0.02] * 21)
    assert cal is not None
    assert I.classify(cal.threshold_ms, cal) is I.Reading.IDLE
    assert I.classify(cal.threshold_ms + 1e-6, cal) is I.Reading.BUSY


@pytest.mark.parametrize("samples", [[], [I.CALIBRATION_CEILING_MS + 0.01] * 21, [0.02] * 20 + [-1.0]],
                         ids=["none", "busy_device", "negative"])
def test_a_calibration_that_does_not_show_an_idle_device_is_refused(samples):
    assert I.calibrate(samples) is None


def test_calibration_at_the_ceiling_is_accepted():
    assert I.calibrate([I.CALIBRATION_CEILING_MS] * 21) is not None


def test_a_device_busy_at_calibration_is_drained_and_calibrated_again():
    clock = FakeClock()
    probe = FakeProbe([BUSY_MS] * I.CALIBRATION_PROBES)
    m = I.IdleMonitor(probe, sleep=clock.sleep, clock=clock)
    assert m.start() and m.calibration is not None and m.calibration.idle_ms == IDLE_MS
    assert clock.now >= I.DRAIN_LIMIT_S  # it waited before the second try


def test_a_device_that_stays_busy_cannot_be_calibrated_and_says_so():
    clock = FakeClock()
    m = I.IdleMonitor(FakeProbe([], then=BUSY_MS), sleep=clock.sleep, clock=clock)
    assert not m.start()
    assert "not idle" in m.note
    tally = I.IdleTally()
    assert m.check(tally) is I.Reading.ERROR and tally.errors == 1


def test_a_probe_that_fails_at_calibration_leaves_the_device_unchecked():
    clock = FakeClock()
    m = I.IdleMonitor(FakeProbe([I.ProbeError("gone")]), sleep=clock.sleep, clock=clock)
    assert not m.start()
    assert "ProbeError: gone" in m.note


# -- after each sample ------------------------------------------------------------------------


def test_an_idle_device_reads_idle_with_one_probe():
    m, probe = monitor([])
    tally = I.IdleTally()
    before = probe.calls
    assert m.check(tally) is I.Reading.IDLE
    assert probe.calls == before + 1 and tally == I.IdleTally(probes=1)


def test_one_slow_probe_alone_is_the_probes_own_hiccup():
    m, _ = monitor([BUSY_MS, IDLE_MS])
    tally = I.IdleTally()
    assert m.check(tally) is I.Reading.IDLE and tally.busy == 0


def test_a_confirmed_busy_device_is_counted_and_drained_before_the_next_member():
    m, probe = monitor([BUSY_MS, BUSY_MS, BUSY_MS, BUSY_MS])
    tally = I.IdleTally()
    assert m.check(tally) is I.Reading.BUSY
    assert tally == I.IdleTally(probes=1, busy=1)
    assert not probe.script  # it kept probing until the device read idle


def test_work_that_outlasts_the_drain_is_counted_as_undrained():
    m, _ = monitor([], then=BUSY_MS)
    tally = I.IdleTally()
    assert m.check(tally) is I.Reading.BUSY
    assert tally.undrained == 1 and tally.found


def test_a_probe_that_fails_after_a_sample_reads_error_and_says_why():
    m, _ = monitor([RuntimeError("device lost")])
    tally = I.IdleTally()
    assert m.check(tally) is I.Reading.ERROR
    assert tally.errors == 1 and "device lost" in m.note


# -- what the tallies mean --------------------------------------------------------------------


def busy(n: int) -> I.IdleTally:
    return I.IdleTally(probes=20, busy=n)


@pytest.mark.parametrize(("trusted", "candidate", "state"), [
    (busy(0), busy(0), DeviceIdle.IDLE),
    (busy(1), busy(0), DeviceIdle.IDLE),  # one reading after the reference: another's late work, drained
    (busy(I.BUSY_SAMPLES), busy(0), DeviceIdle.BUSY),  # the reference's own samples may hold others' work
    (busy(0), busy(20), DeviceIdle.IDLE),  # the candidate's own doing: its finding, not the group's
    (busy(0), I.IdleTally(probes=20, busy=1, undrained=1), DeviceIdle.BUSY),  # the next member was disturbed
    (busy(0), I.IdleTally(probes=20, errors=1), DeviceIdle.UNCHECKED),
], ids=["idle", "trusted_once", "trusted_busy", "candidate_busy", "undrained", "probe_error"])
def test_the_groups_device_state(trusted, candidate, state):
    assert I.device_state(calibrated=True, trusted=[trusted], everyone=[trusted, candidate]) is state


def test_an_uncalibrated_probe_leaves_the_group_unchecked():
    assert I.device_state(calibrated=False, trusted=[busy(0)], everyone=[busy(0)]) is DeviceIdle.UNCHECKED


@pytest.mark.parametrize(("n", "found"), [(0, False), (I.BUSY_SAMPLES - 1, False), (I.BUSY_SAMPLES, True)])
def test_a_candidate_after_whose_samples_the_device_was_busy_is_found_out(n, found):
    facts = TimingFacts(candidate=honest(1.0, device_busy=n), reference=honest(2.0), spot_checks=3)
    rules = [f.rule for f in timing_findings(facts)[0]]
    assert (R.SIDE_WORK_AFTER_RETURN in rules) is found


def side_work(candidate: MemberTiming, reference: MemberTiming, twin: MemberTiming | None = None) -> bool:
    facts = TimingFacts(candidate=candidate, reference=reference, twin=twin, spot_checks=3)
    return R.SIDE_WORK_AFTER_RETURN in [f.rule for f in timing_findings(facts)[0]]


def test_busy_readings_at_the_trusted_members_rate_are_the_machine_not_the_candidate():
    """A loaded CPU makes the host-clocked probe read busy now and then after every member alike:
    3 of 400 beside 2 of 800 for the reference and its A/A copy is no finding."""
    assert not side_work(honest(1.0, device_busy=3, probes=400), honest(2.0, device_busy=1, probes=400),
                         twin=honest(1.0, device_busy=1, probes=400))


def test_work_left_after_most_samples_is_found_whatever_the_trusted_rate():
    assert side_work(honest(1.0, device_busy=390, probes=400), honest(2.0, device_busy=6, probes=400),
                     twin=honest(1.0, device_busy=5, probes=400))
    # and well above the trusted rate, though after few samples: 12 of 400 against 0 of 800
    assert side_work(honest(1.0, device_busy=12, probes=400), honest(2.0, probes=400),
                     twin=honest(1.0, probes=400))


def test_work_outlasting_the_drain_is_found_once_whatever_the_rate():
    assert side_work(honest(1.0, device_busy=1, undrained=1, probes=400), honest(2.0, device_busy=9, probes=400))


@pytest.mark.parametrize(("k", "n", "p", "want"), [(0, 10, 0.3, 1.0), (11, 10, 0.3, 0.0), (10, 10, 0.5, 0.5 ** 10),
                                                   (1, 3, 0.5, 0.875), (2, 400, 1 / 400, 0.2642)])
def test_binomial_tail(k, n, p, want):
    from kernelrl.checks.dynamic import binomial_tail

    assert binomial_tail(k, n, p) == pytest.approx(want, abs=1e-4)


# -- the verdict ------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [DeviceIdle.BUSY, DeviceIdle.UNCHECKED])
def test_a_group_whose_device_was_not_confirmed_idle_pays_nothing(state):
    m = measured(2.0)
    res = V.timed(SETTING, checked(), m, in_group(m, state), roofline=None, environment=ENV)
    assert res.status is Status.JUDGE_ERROR and res.speedup is None
    assert res.environment.timing is not None and res.environment.timing.device_idle is state


@pytest.mark.parametrize("state", [DeviceIdle.IDLE, DeviceIdle.NOT_PROBED])
def test_a_group_whose_device_was_idle_or_not_probed_is_paid(state):
    m = measured(2.0)
    res = V.timed(SETTING, checked(), m, in_group(m, state), roofline=None, environment=ENV)
    assert res.status is Status.CORRECT and res.speedup == 2.0


def test_a_candidate_found_busy_stays_flagged_whatever_the_group():
    m = measured(2.0, device_busy=15)
    res = V.timed(SETTING, checked(), m, in_group(m, DeviceIdle.BUSY), roofline=None, environment=ENV)
    assert res.status is Status.FLAGGED and R.SIDE_WORK_AFTER_RETURN in res.rejecting_rules
    assert res.environment.timing is not None and res.environment.timing.device_busy == 15


def test_a_stored_record_from_before_the_probe_reads_not_probed():
    assert from_plain(TimingRecord, {"rounds": 3}, strict=False).device_idle is DeviceIdle.NOT_PROBED


# -- wired through a measurement (CPU workers, a fake probe) --------------------------------------


class BusyAfterCalibration(I.IdleMonitor):
    """Idle while it calibrates, busy after every sample, and never drained."""

    def start(self) -> bool:
        assert isinstance(self.probe, FakeProbe)
        self.probe.then = IDLE_MS
        ok = super().start()
        self.probe.then = BUSY_MS
        return ok


# the reference of conftest's tiny_task, as a program
IDENTICAL = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return torch.relu(x) * 2.0 + self.bias
"""


def test_a_measurement_probes_after_every_sample_and_its_result_says_so(tiny_task, quick_config):
    import dataclasses

    from kernelrl.judge.evaluator import Evaluator

    with Evaluator(quick_config) as ev:
        probe = FakeProbe([])
        ev.context = dataclasses.replace(ev.context, idle=BusyAfterCalibration(probe, drain_limit_s=0.0))
        res = ev.evaluate(tiny_task, IDENTICAL)
    timing = res.environment.timing
    assert timing is not None and timing.device_idle is DeviceIdle.BUSY
    assert res.status is Status.FLAGGED and R.SIDE_WORK_AFTER_RETURN in res.rejecting_rules, res.message
    assert timing.device_busy >= timing.rounds  # every sample of the candidate was followed by a probe
    # the trusted members' probes reached the rule: busy after theirs too, and still found out
    assert any("after the trusted members' samples" in f.message for f in res.findings
               if f.rule == R.SIDE_WORK_AFTER_RETURN), res.findings


class Hiccups(I.IdleMonitor):
    """After calibration, one check in four reads busy (confirmed, then drained at once), whoever
    was timed: what a loaded CPU does to a host-clocked probe of an idle device."""

    def start(self) -> bool:
        ok = super().start()
        assert isinstance(self.probe, FakeProbe)
        self.probe.script = ([IDLE_MS] * 3 + [BUSY_MS, BUSY_MS, IDLE_MS]) * 1000
        return ok


def test_busy_readings_after_every_member_alike_do_not_find_the_candidate_out(tiny_task, quick_config):
    import dataclasses

    from kernelrl.judge.evaluator import Evaluator

    with Evaluator(quick_config) as ev:
        ev.context = dataclasses.replace(ev.context, idle=Hiccups(FakeProbe([]), drain_limit_s=1.0))
        res = ev.evaluate(tiny_task, IDENTICAL)
    timing = res.environment.timing
    assert timing is not None and timing.device_busy >= 1  # the candidate met the hiccups too
    assert R.SIDE_WORK_AFTER_RETURN not in res.rejecting_rules, [f.message for f in res.findings]


# -- the CUDA probe (a GPU) -------------------------------------------------------------------


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA device")
def test_the_cuda_probe_reads_idle_on_an_idle_device_and_busy_behind_another_context(device_alone):
    import torch

    from kernelrl.judge.harness.device import visible_device

    probe = I.CudaProbe(visible_device(torch.cuda.current_device()))
    try:
        m = I.IdleMonitor(probe)
        torch.cuda.synchronize()
        assert m.start(), m.note
        assert m.check(I.IdleTally()) is I.Reading.IDLE
        torch.cuda._sleep(200_000_000)  # this process's context: another context to the probe's
        tally = I.IdleTally()
        assert m.check(tally) is I.Reading.BUSY, m.calibration
        torch.cuda.synchronize()
    finally:
        probe.close()
