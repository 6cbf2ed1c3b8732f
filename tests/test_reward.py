"""The reward mapping: gate, speedup terms, penalties in order, format and length terms, clipping."""

from __future__ import annotations

import math
import statistics

import pytest

from kernelrl.result import EvalResult, Status
from kernelrl.reward import (
    Penalties,
    RewardConfig,
    RewardModel,
    SmoothingConfig,
    well_formed,
)


def correct(speedup: float, task: str = "t") -> EvalResult:
    return EvalResult(task=task, status=Status.CORRECT, speedup=speedup)


def test_log_speedup_is_symmetric_and_penalties_are_ordered():
    model = RewardModel(RewardConfig(smoothing=SmoothingConfig(enabled=False)))
    assert model.score(correct(2.0)).value == pytest.approx(math.log(2.0))
    assert model.score(correct(0.5)).value == pytest.approx(-math.log(2.0))
    values = {s: model.score(EvalResult(task="t", status=s)).value
              for s in (Status.FLAGGED, Status.INCORRECT, Status.RUNTIME_ERROR, Status.TIMEOUT, Status.COMPILE_ERROR)}
    assert values[Status.FLAGGED] < min(values[Status.INCORRECT], values[Status.RUNTIME_ERROR], values[Status.TIMEOUT])
    assert max(values[Status.INCORRECT], values[Status.RUNTIME_ERROR]) <= values[Status.COMPILE_ERROR]
    assert model.score(EvalResult(task="t", status=Status.TASK_ERROR)) is None
    assert model.score(None).value == Penalties().no_code


def test_penalties_that_reward_hacks_are_refused():
    with pytest.raises(ValueError, match="lowest"):
        Penalties(flagged=0.0)
    with pytest.raises(ValueError, match="compile_error"):
        Penalties(incorrect=0.0, compile_error=-0.5)


def test_other_mappings_and_the_compile_baseline():
    off = SmoothingConfig(enabled=False)
    assert RewardModel(RewardConfig(mapping="speedup", smoothing=off)).score(correct(4.0)).value == 4.0
    capped = RewardModel(RewardConfig(mapping="capped_linear", speedup_cap=3.0, correct_bonus=0.3, smoothing=off))
    assert capped.score(correct(10.0)).value == pytest.approx(3.3)
    vs_compile = RewardModel(RewardConfig(baseline="compile", mapping="speedup", smoothing=off))
    r = vs_compile.score(correct(3.0), compile_speedup=1.5)
    assert r.speedup == pytest.approx(2.0) and r.value == pytest.approx(2.0)


def test_format_and_length_terms():
    model = RewardModel(RewardConfig(format_weight=0.2, length_weight=0.5, length_soft_tokens=100,
                                     length_max_tokens=200, smoothing=SmoothingConfig(enabled=False)))
    good = "analysis\n```python\nclass ModelNew:\n    pass\n```\n"
    assert well_formed(good) and not well_formed(good + good) and not well_formed("no code")
    r = model.score(correct(1.0), answer=good, completion_tokens=150)
    assert r.parts["format"] == 0.2 and r.parts["length"] == pytest.approx(-0.25)
    assert model.score(correct(1.0), answer="no code", completion_tokens=500).parts == {
        "speedup": 0.0, "format": 0.0, "length": -0.5}


def test_a_reward_ten_sigma_above_the_window_is_clipped_at_one_and_a_half_sigma():
    model = RewardModel(RewardConfig(mapping="speedup", smoothing=SmoothingConfig(window=16, k=1.5, min_samples=8)))
    history = [1.0, 1.2, 0.8, 1.1, 0.9, 1.0, 1.05, 0.95]
    for s in history:
        assert not model.score(correct(s)).clipped
    mean, sigma = statistics.fmean(history), statistics.pstdev(history)
    r = model.score(correct(mean + 10 * sigma))
    assert r.raw == pytest.approx(mean + 10 * sigma)
    assert r.clipped and r.value == pytest.approx(mean + 1.5 * sigma) and r.bound == pytest.approx(r.value)
    # the window keeps the clipped value, so the exploit does not widen the next bound
    assert model.window("t")[-1] == pytest.approx(mean + 1.5 * sigma)


def test_a_new_task_is_clipped_by_its_level_until_it_has_a_window():
    model = RewardModel(RewardConfig(mapping="speedup", smoothing=SmoothingConfig(window=8, min_samples=4)))
    for s in (1.0, 1.1, 0.9, 1.0):
        model.score(correct(s, task="a"), level=1)
    assert model.score(correct(50.0, task="b"), level=1).clipped
    assert not model.score(correct(50.0, task="c"), level=2).clipped  # level 2 has no window yet
