"""Typed result records: what they print of themselves."""

from __future__ import annotations

from kernelrl.result import GroupPhases


def test_group_phases_describe_names_the_phases_that_took_time_in_order():
    phases = GroupPhases(reference_load_s=7.94, candidate_checks_s=7.8, timing_s=21.9, timing_spot_checks_s=7.6)
    assert phases.describe() == "reference_load 7.9, candidate_checks 7.8, timing 21.9, timing_spot_checks 7.6"
    assert GroupPhases().describe() == ""
