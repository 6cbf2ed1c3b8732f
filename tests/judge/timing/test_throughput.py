"""`Throughput`: evaluations per hour of a span, and its groups' phases summed once per group."""

from __future__ import annotations

import dataclasses

import pytest

from kernelrl.judge.timing.throughput import Throughput
from kernelrl.result import Environment, EvalResult, GroupPhases, Status


def _result(group: str, phases: GroupPhases | None) -> EvalResult:
    return EvalResult(task="t", status=Status.INCORRECT, environment=Environment(group=group, phases=phases))


def test_a_groups_phases_count_once_however_many_of_its_results_are_passed():
    a = GroupPhases(reference_load_s=2.0, candidate_checks_s=6.0, timing_s=4.0, timing_samples_s=3.0,
                    stray_checks_s=0.5)
    b = GroupPhases(reference_load_s=1.0, candidate_checks_s=2.0, timing_s=1.0)
    got = Throughput.of([_result("g1", a), _result("g1", a), _result("g1", a), _result("g2", b),
                         _result("", None)], wall_s=60.0)
    assert got.evaluations == 5 and got.groups == 2 and got.per_hour == pytest.approx(300.0)
    assert got.phases.reference_load_s == 3.0 and got.phases.candidate_checks_s == 8.0
    assert got.group_wall_s == pytest.approx(16.0)
    split = {name: (s, share) for name, s, share in got.split()}
    assert list(split)[:4] == ["reference_load", "candidate_checks", "timing", "timing_samples"]
    assert split["timing"] == (5.0, pytest.approx(5 / 16)) and split["stray_checks"][0] == 0.5
    assert "5 evaluations in 60 s: 300 an hour; 2 groups: reference_load 3.0 (19%)" in got.describe()
    assert got.to_dict()["phases"]["timing_samples_s"] == 3.0


def test_a_verdict_handed_out_again_from_the_result_cache_is_not_an_evaluation():
    phases = GroupPhases(reference_load_s=1.0)
    again = EvalResult(task="t", status=Status.INCORRECT, environment=Environment(group="g", phases=phases, cached=True))
    got = Throughput.of([again, _result("h", phases)], wall_s=10.0)
    assert (got.evaluations, got.groups, got.phases.reference_load_s) == (1, 1, 1.0)


def test_an_empty_span_has_no_rate_and_nothing_negative_is_taken():
    assert Throughput.of([], wall_s=0.0).per_hour is None
    with pytest.raises(ValueError):
        dataclasses.replace(Throughput.of([], wall_s=1.0), evaluations=-1)
