"""GRPO-RoC selection: shares by side, floors, cleanest positives, uniform negatives."""

from __future__ import annotations

import random

import pytest

from kernelrl.result import EvalResult, Finding, Severity, Status
from kernelrl.train.roc import RoCConfig, groups, problems, select

ON = RoCConfig(enabled=True, keep=0.5, min_per_side=2)


def test_sides_keep_their_share_with_a_floor():
    raws = [1.0, 0.5] + [-0.5] * 14  # 2 positives of 16
    kept = select(raws, [0] * 16, ON, random.Random(0))
    assert sum(kept) == 8 and kept[0] and kept[1]  # floored at 2 although their share is 1 of 8
    raws = [0.1 * (i + 1) for i in range(15)] + [-0.3]  # 15 positives, 1 negative
    kept = select(raws, [0] * 16, ON, random.Random(0))
    assert sum(kept) == 8 and kept[15]  # the only negative stays
    assert [i for i in range(15) if kept[i]] == list(range(8, 15))  # the 7 best positives


def test_positives_are_taken_cleanest_first_and_negatives_uniformly():
    raws = [2.0, 1.0, 0.5, 0.4] + [-0.5] * 4
    counts = [3, 0, 0, 1] + [0] * 4
    kept = select(raws, counts, RoCConfig(enabled=True, keep=0.5, min_per_side=1), random.Random(0))
    assert [i for i in range(4) if kept[i]] == [1, 2]  # the fastest has problems: it waits
    seen = set()
    for seed in range(30):
        kept = select(raws, counts, RoCConfig(enabled=True, keep=0.5, min_per_side=1), random.Random(seed))
        seen |= {i for i in range(4, 8) if kept[i]}
    assert seen == {4, 5, 6, 7}  # every failure gets its turn


def test_rollouts_without_reward_are_never_kept_and_off_keeps_all():
    raws = [None, 1.0, -0.5, None]
    assert select(raws, [0] * 4, RoCConfig(), random.Random(0)) == [False, True, True, False]
    kept = select(raws, [0] * 4, RoCConfig(enabled=True, keep=1.0), random.Random(0))
    assert kept == [False, True, True, False]


def test_problem_counts():
    good = "why\n```python\nclass ModelNew:\n    pass\n```\n"
    assert problems(good, None) == 0
    assert problems(good + "```python\nx = 1\n```\n", None) == 1
    assert problems("no code", None) == 1
    warned = EvalResult(task="t", status=Status.CORRECT, speedup=1.0,
                        findings=[Finding(rule="try_fallback", message="m", severity=Severity.WARN)])
    assert problems(good, warned, truncated=True) == 2


def test_a_measurement_warning_is_no_problem_of_the_answer():
    """A roofline floor beaten comes with being fast: RoC must not drop the fastest rollouts first."""
    good = "why\n```python\nclass ModelNew:\n    pass\n```\n"
    fast = EvalResult(task="t", status=Status.CORRECT, speedup=8.0,
                      findings=[Finding(rule="compute_floor_beaten", message="m", severity=Severity.WARN)])
    assert problems(good, fast) == 0
    kept = select([2.08, 1.39, 1.39, -3.0], [problems(good, fast), 0, 0, 1], RoCConfig(enabled=True, keep=0.5,
                                                                                     min_per_side=1),
                  random.Random(0))
    assert kept[0]  # the fastest positive is among the kept


def test_groups_are_runs_of_equal_keys():
    assert groups(["a", "a", "b", "b", "a"]) == [[0, 1], [2, 3], [4]]


def test_bad_config():
    with pytest.raises(ValueError):
        RoCConfig(keep=0)
