"""The timing statistics: paired ratios from the judge's clock, their median and its interval; the
timing pool sent before the measurement."""

from __future__ import annotations

import dataclasses
import random
import time
from types import SimpleNamespace

import pytest

from kernelrl.judge.harness import protocol as P
from kernelrl.judge.harness.bench import call_floor_ns
from kernelrl.judge.harness.channel import ChannelTimeout
from kernelrl.judge.timing.timer import (
    CandidateTiming,
    GroupTiming,
    PoolsSent,
    TimingConfig,
    _ratios,
    aa_band,
    aa_noisy,
    measure_group,
    median_ci,
    precision_goal,
)
from kernelrl.result import TimingStop


def test_median_ci_contains_the_true_ratio_and_narrows_with_n():
    rng = random.Random(0)
    few = [2.0 * rng.lognormvariate(0, 0.05) for _ in range(20)]
    many = [2.0 * rng.lognormvariate(0, 0.05) for _ in range(400)]
    _med, lo, hi = median_ci(few)
    med2, lo2, hi2 = median_ci(many)
    assert lo <= 2.0 <= hi and lo2 <= 2.0 <= hi2
    assert (hi2 - lo2) < (hi - lo)
    assert abs(med2 - 2.0) < 0.02


def test_median_ci_ignores_outliers():
    ratios = [1.0] * 30 + [50.0, 0.01]
    med, lo, hi = median_ci(ratios)
    assert med == pytest.approx(1.0) and lo == pytest.approx(1.0) and hi == pytest.approx(1.0)


@pytest.mark.parametrize("kwargs", [{"min_rounds": 2}, {"max_rounds": 3, "min_rounds": 5}, {"target_rel_ci": 0},
                                    {"spot_check_prob": 2.0}, {"pool_size": 0}])
def test_config_validation(kwargs):
    with pytest.raises(ValueError):
        TimingConfig(**kwargs)


def test_ratios_come_from_round_trips_net_of_the_reference_overhead():
    # round trips in ns: the reference's sample took 1.1 ms, the candidate's 0.6 ms, and the
    # exchange costs 0.1 ms on both sides: 1.0 ms against 0.5 ms of work
    assert _ratios([(1_100_000, 600_000)], 100_000) == pytest.approx([2.0])
    # no overhead known yet: the raw ratio
    assert _ratios([(1_100_000, 600_000)], 0) == pytest.approx([1_100_000 / 600_000])


def test_a_sample_faster_than_the_overhead_cannot_divide_by_zero():
    (r,) = _ratios([(1_000_000, 50_000)], 100_000)
    assert r == pytest.approx(900_000 / 5_000)


def test_call_floor_is_the_median_bracket_around_nothing():
    now = [0]
    costs = iter([5, 7, 6] * 10)  # each synchronisation's cost, in clock ticks

    def clock() -> int:
        return now[0]

    def sync() -> None:
        now[0] += next(costs)

    # each bracket: sync (before t0, not counted), t0, sync, t1: the second sync of each pair counts
    assert call_floor_ns(sync, clock, n=9) == 6.0


def test_the_call_floor_taken_off_undoes_the_pull_toward_one():
    # samples of 4 calls: the reference's calls do 20 us of work, the candidate's 10 us; each call
    # also pays a 10 us bracket, the exchange 50 us per sample. With the exchange alone taken off,
    # the 2x kernel measures (4*30)/(4*20) = 1.5x; with the floor taken off too, 2x.
    ref, cand = 50_000 + 4 * 30_000, 50_000 + 4 * 20_000
    assert _ratios([(ref, cand)], 50_000) == pytest.approx([1.5])
    assert _ratios([(ref, cand)], 50_000 + 4 * 10_000) == pytest.approx([2.0])


def _aa(speedup: float | None, ci: tuple[float, float] | None) -> CandidateTiming:
    return CandidateTiming(speedup=speedup, speedup_ci=ci, rel_ci_half_width=0.01, stopped_by=TimingStop.CI,
                           times_ms=[1.0], facts=None, failure=None, output_bytes=0)


@pytest.mark.parametrize("speedup, ci, noisy", [
    (1.00, (0.98, 1.02), False),   # identical code at 1.00
    (1.04, (1.01, 1.07), False),   # off by 4 %, inside the 5 % tolerance
    (1.08, (1.03, 1.12), False),   # the interval still reaches inside the tolerance
    (1.10, (1.06, 1.14), True),    # wholly beyond 1.05: the machine was disturbed
    (0.90, (0.87, 0.94), True),    # wholly below 1 / 1.05
    (None, None, True),            # the copy failed: nothing vouches for the measurement
])
def test_an_aa_pair_is_noisy_only_when_its_interval_lies_outside_the_tolerance(speedup, ci, noisy):
    assert aa_noisy(_aa(speedup, ci), 0.05) is noisy
    assert aa_noisy(None, 0.05)


def test_the_aa_band_is_symmetric_about_one_and_holds_what_identical_code_measured():
    timing = GroupTiming(reference_ms=[1.0], candidates={}, rounds=10, calls_per_sample=1, stopped_by=TimingStop.CI,
                         wall_s=1.0, aa_speedup=1.10, aa_ci=(1.06, 1.14))
    lo, hi = aa_band(timing)
    assert hi == pytest.approx(1.14) and lo == pytest.approx(1 / 1.14)
    below = GroupTiming(reference_ms=[1.0], candidates={}, rounds=10, calls_per_sample=1, stopped_by=TimingStop.CI,
                        wall_s=1.0, aa_speedup=0.9, aa_ci=(0.85, 0.95))
    assert aa_band(below) == pytest.approx((0.85, 1 / 0.85))
    assert aa_band(GroupTiming(reference_ms=[], candidates={}, rounds=0, calls_per_sample=1,
                               stopped_by=TimingStop.FAILED, wall_s=0.0)) is None


class _PoolTaker:
    """A worker as `send_pools` sees it: takes a pool, or fails to."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.fail, self.killed, self.got = fail, False, None

    def request(self, header, payload, *, deadline):
        if self.fail is not None:
            raise self.fail
        self.got = header
        return SimpleNamespace(failed=False, header=P.Pooled(n=len(payload), allocator_pinned=True))

    def kill(self):
        self.killed = True


def test_the_pool_goes_out_before_the_measurement_and_a_member_that_cannot_take_it_is_killed():
    from kernelrl.judge.timing.timer import ReferenceTimingFailed, send_pools

    ref, good, bad = _PoolTaker(), _PoolTaker(), _PoolTaker(ChannelTimeout("hung"))
    sent = send_pools(ref, {"good": good, "bad": bad}, [[1.0]], TimingConfig(), rng=random.Random(0),
                      deadline=time.monotonic() + 10)
    assert set(sent.failed) == {"bad"} and bad.killed and not good.killed and not ref.killed
    assert ref.got == good.got  # one pool, one noise seed, for every member
    assert sent.pinned == (True, True)
    with pytest.raises(ReferenceTimingFailed):
        send_pools(_PoolTaker(ChannelTimeout("hung")), {"good": _PoolTaker()}, [[1.0]], TimingConfig(),
                   rng=random.Random(0), deadline=time.monotonic() + 10)


def _lognormal(rng: random.Random, centre: float, sigma: float, n: int) -> list[float]:
    return [centre * rng.lognormvariate(0, sigma) for _ in range(n)]


def test_the_precision_goal_widens_to_half_an_offset_the_aa_interval_establishes():
    rng = random.Random(1)
    config = TimingConfig()
    # identical code 20 % apart over 200 rounds: its interval excludes 1, so half the offset
    assert precision_goal(config, _lognormal(rng, 1.2, 0.03, 200)) == pytest.approx(0.1, abs=0.01)
    assert precision_goal(config, _lognormal(rng, 1 / 1.2, 0.03, 200)) == pytest.approx(0.1, abs=0.01)
    # identical code at 1: the configured target
    assert precision_goal(config, _lognormal(rng, 1.0, 0.03, 200)) == config.target_rel_ci
    # 3 % off in 20 noisy rounds: the interval holds 1, nothing is established
    few = _lognormal(rng, 1.03, 0.2, 20)
    assert median_ci(few)[1] <= 1.0 <= median_ci(few)[2]
    assert precision_goal(config, few) == config.target_rel_ci
    # a small established offset never asks for less than the target; no copy, or the share off: the target
    assert precision_goal(config, _lognormal(rng, 1.01, 0.001, 200)) == config.target_rel_ci
    assert precision_goal(config, []) == config.target_rel_ci
    assert precision_goal(TimingConfig(aa_precision_share=0.0), _lognormal(rng, 1.2, 0.03, 200)) == config.target_rel_ci


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_the_aa_precision_share_is_a_share(share):
    with pytest.raises(ValueError):
        TimingConfig(aa_precision_share=share)


class _TimedProcess:
    """A worker as the measurement sees it, whose samples take `centre_ms` x lognormal noise on the
    judge's clock: a process faster or slower than another for its whole life is a centre of its own."""

    def __init__(self, centre_ms: float, rng: random.Random) -> None:
        self.centre_ms, self.rng = centre_ms, rng
        self.last_exchange_ns, self.spot_outputs, self.uncommitted_outputs = 0, 0, 0

    def request(self, header, payload=None, *, deadline):
        if isinstance(header, P.Warmup):
            reply = P.Warm(calls=header.calls, call_ms=self.centre_ms, state_after={})
        elif isinstance(header, P.Output):
            return SimpleNamespace(failed=False, header=SimpleNamespace(inputs_digest="same"), payload={"output": 1.0})
        else:
            reply = SimpleNamespace()
        self.last_exchange_ns = 1000
        return SimpleNamespace(failed=False, header=reply, payload={})

    def command(self, kind, payload=None, *, deadline):
        t_ns = int(self.centre_ms * self.rng.lognormvariate(0, 0.05) * 1e6)
        self.last_exchange_ns = t_ns
        return SimpleNamespace(failed=False, header=P.Called(t_ns=[t_ns], plain=True, commits=[0]), payload={})

    def cpu_time_ns(self):
        return None

    def thread_count(self):
        return 1

    def kill(self):
        raise AssertionError("no member fails here")


def _group(twin_ms: float, config: TimingConfig, seed: int = 0):
    rng = random.Random(seed)
    members = {"fast": _TimedProcess(0.5, rng), "copy": _TimedProcess(twin_ms, rng)}
    return measure_group(_TimedProcess(1.0, rng), members, [[1.0]], PoolsSent(failed={}, pinned=(True,)), config,
                         rng=random.Random(seed), deadline=time.monotonic() + 60, trusted=frozenset({"copy"}), twin="copy")


def test_a_group_whose_copy_is_established_off_stops_at_half_that_offset_not_at_the_target():
    # 5 % noise per sample never reaches +-1 % within 80 rounds; the copy's process 25 % slower does
    # establish itself, and every interval reaches 12.5 % long before the round cap
    config = TimingConfig(min_rounds=15, max_rounds=80, max_timing_s=60.0, min_spot_checks=3, min_sample_ms=0.0)
    off = _group(1.25, config)
    assert off.stopped_by is TimingStop.AA_OFFSET and off.rounds < 40
    fast = off.candidates["fast"]
    assert fast.speedup_ci is not None and fast.speedup_ci[0] <= 2.0 <= fast.speedup_ci[1]
    assert 0.01 < fast.rel_ci_half_width <= 0.125
    # the same group with its copy at 1: the target holds, and the rounds run out
    same = _group(1.0, config)
    assert same.stopped_by is TimingStop.ROUNDS and same.rounds == 80
    # and with the rule off, the established offset changes nothing
    assert _group(1.25, dataclasses.replace(config, aa_precision_share=0.0)).stopped_by is TimingStop.ROUNDS
