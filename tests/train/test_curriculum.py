"""Curriculum by level and difficulty-aware resampling."""

from __future__ import annotations

from collections import Counter

from kernelrl.tasks.task import Task
from kernelrl.train.curriculum import Curriculum, CurriculumConfig

TASKS = [Task(name=f"l{lvl}/t{i}", source="", level=lvl) for lvl in (1, 2) for i in range(2)]


def test_only_the_first_level_until_half_of_it_is_solved():
    c = Curriculum(TASKS, CurriculumConfig(promote_solved=0.5), seed=0)
    assert {c.draw().level for _ in range(50)} == {1}
    c.observe("l1/t0", [0.0, 1.0], any_correct=True)
    assert c.open_levels == (1, 2)
    assert {c.draw().level for _ in range(100)} == {1, 2}


def test_the_next_level_opens_after_enough_draws_anyway():
    c = Curriculum(TASKS, CurriculumConfig(promote_after=5), seed=0)
    for _ in range(5):
        c.draw()
    assert c.open_levels == (1, 2)
    assert Curriculum(TASKS, CurriculumConfig(by_level=False)).open_levels == (1, 2)


def test_flat_or_unsolved_groups_come_back_sooner_but_not_forever():
    cfg = CurriculumConfig(by_level=False, resample_weight=5.0, max_resamples=2)
    c = Curriculum(TASKS, cfg, seed=1)
    c.observe("l2/t1", [-0.5, -0.5, -0.5], any_correct=False)
    counts = Counter(c.draw().name for _ in range(2000))
    assert counts["l2/t1"] > 2.5 * counts["l1/t0"]  # weight 5 against 1
    c.observe("l2/t1", [-0.5, -0.5], any_correct=False)
    c.observe("l2/t1", [-0.5, -0.5], any_correct=False)  # third in a row: beyond max_resamples
    assert c.weight("l2/t1") == 1.0
    c.observe("l1/t0", [0.1, 0.1], any_correct=True)  # solved but flat: no signal either
    assert c.weight("l1/t0") == 5.0
    c.observe("l1/t0", [0.1, -0.5], any_correct=True)
    assert c.weight("l1/t0") == 1.0


def test_state_round_trip_reproduces_the_draws():
    a = Curriculum(TASKS, seed=3)
    a.observe("l1/t1", [0.0, 1.0], any_correct=True)
    for _ in range(7):
        a.draw()
    b = Curriculum(TASKS, seed=99)
    b.load_state(a.state())
    assert [a.draw().name for _ in range(20)] == [b.draw().name for _ in range(20)]
