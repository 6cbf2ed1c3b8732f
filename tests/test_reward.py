"""The reward mapping: its semantics as properties (kernelrl.reward's docstring, items 1-8), over the
default config, CUDA-L1's mapping, capped linear and every shipped training config; then the
terms, the noise rule and the clip, one example each."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelrl.config import build, load_toml
from kernelrl.result import EvalResult, Status
from kernelrl.reward import (
    Penalties,
    RewardConfig,
    RewardModel,
    SmoothingConfig,
    within_noise,
)
from kernelrl.train.recipe import TRAIN_CONFIG_DIR, load_train_config

FAILURES = (Status.FLAGGED, Status.TIMEOUT, Status.RUNTIME_ERROR, Status.INCORRECT, Status.COMPILE_ERROR)
CONFIGS: dict[str, RewardConfig] = {
    "default": RewardConfig(),
    "cuda-l1": RewardConfig(mapping="speedup"),
    "capped-linear": RewardConfig(mapping="speedup", speedup_cap=3.0, correct_bonus=0.3),
    "vs-compile": RewardConfig(baseline="compile", correct_bonus=0.3, format_weight=0.1, length_weight=0.2),
    # each training config's reward table, built as `load_train_config` builds it (the whole config
    # would check its TRL arguments against TRL, whose import costs seconds at collection)
    **{f"train:{p.stem}": build(RewardConfig, load_toml(p.stem, TRAIN_CONFIG_DIR).get("reward", {}), where="reward")
       for p in sorted(TRAIN_CONFIG_DIR.glob("*.toml"))},
}
GOOD = "```python\nclass ModelNew:\n    pass\n```\n"

speedups = st.floats(min_value=1e-9, max_value=1e9, allow_nan=False, allow_infinity=False)
configs = st.sampled_from(sorted(CONFIGS))
answers = st.sampled_from([None, GOOD, "no code", GOOD + GOOD])
tokens = st.one_of(st.none(), st.integers(min_value=0, max_value=20000))
intervals = st.one_of(st.none(), st.tuples(speedups, speedups).map(sorted).map(tuple))
# a window history: raw rewards of earlier correct results of the task
histories = st.lists(speedups, max_size=24)


def correct(speedup: float, *, ci=None, band=None, task: str = "t") -> EvalResult:
    return EvalResult(task=task, status=Status.CORRECT, speedup=speedup, speedup_ci=ci, noise_band=band)


def model_after(name: str, history: list[float]) -> RewardModel:
    model = RewardModel(CONFIGS[name])
    for s in history:
        model.score(correct(s), level=1, compile_speedup=1.5)
    return model


def score(model: RewardModel, result: EvalResult | None, answer=None, n=None) -> float:
    reward = model.score(result, answer=answer, completion_tokens=n, level=1, compile_speedup=1.5)
    assert reward is not None
    return reward.value


def outcomes(model: RewardModel, answer, n) -> dict[str, float]:
    out = {s.value: score(model, EvalResult(task="t", status=s), answer, n) for s in FAILURES}
    out["no_code"] = score(model, None, answer, n)
    return out


@settings(max_examples=200, deadline=None)
@given(name=configs, s=speedups, ci=intervals, history=histories, a1=answers, n1=tokens, a2=answers, n2=tokens)
def test_every_correct_result_scores_above_every_failure(name, s, ci, history, a1, n1, a2, n2):
    model = model_after(name, history)
    assert score(model, correct(s, ci=ci), a1, n1) > max(outcomes(model, a2, n2).values())


@settings(max_examples=200, deadline=None)
@given(name=configs, s=speedups, history=histories, a1=answers, n1=tokens, a2=answers, n2=tokens)
def test_flagged_is_the_lowest_outcome(name, s, history, a1, n1, a2, n2):
    model = model_after(name, history)
    flagged = score(model, EvalResult(task="t", status=Status.FLAGGED), a1, n1)
    others = {k: v for k, v in outcomes(model, a2, n2).items() if k != "flagged"}
    assert flagged < min(*others.values(), score(model, correct(s), a2, n2))


@settings(max_examples=200, deadline=None)
@given(name=configs, a=speedups, b=speedups, ci=intervals, band=intervals, history=histories)
def test_monotone_in_speedup_for_the_same_noise_information(name, a, b, ci, band, history):
    lo, hi = sorted((a, b))
    state = model_after(name, history).state()
    first, second = RewardModel(CONFIGS[name]), RewardModel(CONFIGS[name])
    first.load_state(state)
    second.load_state(state)  # the same window for both
    assert score(first, correct(lo, ci=ci, band=band)) <= score(second, correct(hi, ci=ci, band=band))


@settings(max_examples=200, deadline=None)
@given(name=configs, s=speedups, ci=intervals, history=histories, a=answers, n=tokens,
       status=st.sampled_from(FAILURES))
def test_bounded_on_both_sides(name, s, ci, history, a, n, status):
    model = model_after(name, history)
    low, high = model.bounds()
    assert math.isfinite(low) and math.isfinite(high)
    for value in (score(model, correct(s, ci=ci), a, n), score(model, EvalResult(task="t", status=status), a, n),
                  score(model, None, a, n)):
        assert low <= value <= high


def test_a_task_that_improves_keeps_paying_more_for_more():
    """Correct speedups rising from 1x to 3x over 200 samples: at the end 3x still pays above 2x."""
    model = RewardModel(RewardConfig())
    for i in range(200):
        model.score(correct(1.0 + 2.0 * i / 199))
    at_end = model.state()
    three, two = RewardModel(model.config), RewardModel(model.config)
    three.load_state(at_end)
    two.load_state(at_end)
    r3, r2 = three.score(correct(3.0)), two.score(correct(2.0))
    assert r3.value > r2.value
    assert not r2.clipped and r2.value == r2.raw  # below the band: paid as it is, never lifted
    # the window holds raw values: the last one is log(3), not its clipped value
    assert three.window("t")[-1] == pytest.approx(math.log(3.0))


def test_an_outlier_is_damped_to_one_and_a_half_sigma_above_and_a_low_reward_is_never_lifted():
    model = RewardModel(RewardConfig(mapping="speedup", smoothing=SmoothingConfig(window=16, k=1.5, min_samples=8)))
    history = [1.0, 1.2, 0.8, 1.1, 0.9, 1.0, 1.05, 0.95]
    for s in history:
        assert not model.score(correct(s)).clipped
    mean, sigma = statistics.fmean(history), statistics.pstdev(history)
    r = model.score(correct(mean + 4 * sigma))
    assert r.raw == pytest.approx(mean + 4 * sigma)
    assert r.clipped and r.value == pytest.approx(mean + 1.5 * sigma) and r.band[1] == pytest.approx(r.value)
    assert model.window("t")[-1] == pytest.approx(r.raw)  # the raw value, not the clipped one
    low = model.score(correct(0.2))
    assert low.raw < low.band[0] and not low.clipped and low.value == low.raw


def test_a_flat_window_still_orders_better_from_worse():
    model = RewardModel(RewardConfig(smoothing=SmoothingConfig(window=8, min_samples=4, min_width=0.05)))
    for _ in range(8):
        model.score(correct(1.0))
    state = model.state()
    faster, same = RewardModel(model.config), RewardModel(model.config)
    faster.load_state(state)
    same.load_state(state)
    assert faster.score(correct(2.0)).value == pytest.approx(0.05) and same.score(correct(1.0)).value == 0.0


def test_a_new_task_is_clipped_by_its_level_until_it_has_a_window():
    model = RewardModel(RewardConfig(mapping="speedup", smoothing=SmoothingConfig(window=8, min_samples=4)))
    for s in (1.0, 1.1, 0.9, 1.0):
        model.score(correct(s, task="a"), level=1)
    assert model.score(correct(5.0, task="b"), level=1).clipped
    assert not model.score(correct(5.0, task="c"), level=2).clipped  # level 2 has no window yet


def test_a_speedup_within_noise_pays_as_no_speedup():
    model = RewardModel(RewardConfig(smoothing=SmoothingConfig(enabled=False), correct_bonus=0.3))
    no_speedup = model.score(correct(1.0)).value
    assert no_speedup == pytest.approx(0.3)
    # identical code: 1.03x measured, its interval holds 1.0
    r = model.score(correct(1.03, ci=(0.98, 1.07)))
    assert r.within_noise and r.speedup == 1.0 and r.value == no_speedup
    # inside the task's A/A band, even with a tight interval
    r = model.score(correct(1.02, ci=(1.015, 1.025), band=(0.97, 1.04)))
    assert r.within_noise and r.value == no_speedup
    # a real speedup, and a real slowdown, pay as measured
    assert model.score(correct(1.5, ci=(1.4, 1.6), band=(0.97, 1.04))).value == pytest.approx(0.3 + math.log(1.5))
    assert model.score(correct(0.8, ci=(0.75, 0.85))).value == pytest.approx(0.3 + math.log(0.8))
    # an interval that reaches into the band cannot be told from identical code; one clear of it can
    assert within_noise(correct(1.058, ci=(1.031, 1.082), band=(0.96, 1.04)))
    assert not within_noise(correct(1.06, ci=(1.045, 1.08), band=(0.96, 1.04)))
    assert within_noise(correct(0.94, ci=(0.92, 0.965), band=(0.96, 1.04)))  # slower alike: paid 1.0x
    # a band that misses 1.0 is widened to hold it: 0.99 inside (0.95, 0.98) + 1.0 pays 1.0x
    assert within_noise(correct(0.99, band=(0.95, 0.98))) and not within_noise(correct(0.9, band=(0.95, 0.98)))
    off = RewardModel(RewardConfig(noise=False, smoothing=SmoothingConfig(enabled=False)))
    assert off.score(correct(1.03, ci=(0.98, 1.07))).value == pytest.approx(math.log(1.03))
    # against torch.compile, noise pays what the reference itself does against it
    vs = RewardModel(RewardConfig(baseline="compile", smoothing=SmoothingConfig(enabled=False)))
    assert vs.score(correct(1.03, ci=(0.98, 1.07)), compile_speedup=2.0).speedup == pytest.approx(0.5)


def test_the_interval_of_a_result_survives_json():
    r = correct(1.01, ci=(0.99, 1.03), band=(0.97, 1.04))
    back = EvalResult.from_dict(r.to_dict())
    assert back.speedup_ci == (0.99, 1.03) and back.noise_band == (0.97, 1.04)


def test_fixed_values_and_the_order_of_penalties():
    model = RewardModel(RewardConfig(smoothing=SmoothingConfig(enabled=False)))
    assert model.score(correct(2.0)).value == pytest.approx(math.log(2.0))
    assert model.score(correct(0.5)).value == pytest.approx(-math.log(2.0))
    assert model.score(correct(1e-6)).value == pytest.approx(math.log(0.1))  # held at the floor
    assert model.score(correct(1e6)).value == pytest.approx(math.log(10.0))  # and at the cap
    assert model.score(EvalResult(task="t", status=Status.TASK_ERROR)) is None
    assert model.score(EvalResult(task="t", status=Status.JUDGE_ERROR)) is None  # the judge failed, not the policy
    assert model.score(None).value == Penalties().no_code
    assert model.score(EvalResult(task="t", status=Status.CORRECT)).value == 0.0  # correct, not timed


def test_settings_that_would_reward_failing_or_hacking_are_refused():
    with pytest.raises(ValueError, match="lowest"):
        Penalties(flagged=-2.0)
    with pytest.raises(ValueError, match="compile_error"):
        Penalties(incorrect=-2.0, compile_error=-2.6)
    with pytest.raises(ValueError, match="slowest correct result"):
        RewardConfig(speedup_floor=0.01)  # log(0.01) = -4.6 would sit below a compile error
    with pytest.raises(ValueError, match="slowest correct result"):
        RewardConfig(length_weight=0.5)  # a long correct answer would sit below a short compile error
    with pytest.raises(ValueError, match="bounded"):
        RewardConfig(speedup_cap=math.inf)


def test_cuda_l1_mapping_capped_linear_and_the_compile_baseline():
    off = SmoothingConfig(enabled=False)
    assert RewardModel(RewardConfig(mapping="speedup", smoothing=off)).score(correct(4.0)).value == 4.0
    capped = RewardModel(RewardConfig(mapping="speedup", speedup_cap=3.0, correct_bonus=0.3, smoothing=off))
    assert capped.score(correct(10.0)).value == pytest.approx(3.3)
    vs_compile = RewardModel(RewardConfig(baseline="compile", mapping="speedup", smoothing=off))
    r = vs_compile.score(correct(3.0), compile_speedup=1.5)
    assert r.speedup == pytest.approx(2.0) and r.value == pytest.approx(2.0)
    assert "baseline_missing" in vs_compile.score(correct(3.0)).parts


def test_format_and_length_terms():
    model = RewardModel(RewardConfig(format_weight=0.1, length_weight=0.05, length_soft_tokens=100,
                                     length_max_tokens=200, smoothing=SmoothingConfig(enabled=False)))
    from kernelrl.reward import well_formed

    assert well_formed(GOOD) and not well_formed(GOOD + GOOD) and not well_formed("no code")
    r = model.score(correct(1.0), answer=GOOD, completion_tokens=150)
    assert r.parts["format"] == 0.1 and r.parts["length"] == pytest.approx(-0.025)
    assert model.score(correct(1.0), answer="no code", completion_tokens=500).parts == {
        "speedup": 0.0, "format": 0.0, "length": -0.05}


@settings(max_examples=200, deadline=None)
@given(name=configs, history=histories, a1=answers, n1=tokens)
def test_abstaining_never_pays_more_than_a_program_that_ran(name, history, a1, n1):
    """Item 3: no code <= every failure of a program that ran (timeout, runtime error, incorrect)."""
    model = model_after(name, history)
    out = outcomes(model, a1, n1)
    assert out["no_code"] <= min(out["timeout"], out["runtime_error"], out["incorrect"])
    with pytest.raises(ValueError, match="abstaining"):
        Penalties(no_code=-2.9)


@settings(max_examples=100, deadline=None)
@given(name=configs, history=histories, speeds=st.lists(speedups, min_size=2, max_size=8), seed=st.integers(0, 99))
def test_a_batch_clip_does_not_depend_on_the_order_of_the_batch(name, history, speeds, seed):
    """Item 10: permuting a batch permutes its rewards and changes nothing else; within the batch
    (one task) the clipped rewards are in the order of the speedups."""
    import random

    batch = [(model_after(name, history).raw(correct(s), compile_speedup=1.5), "t", 1) for s in speeds]
    order = list(range(len(batch)))
    random.Random(seed).shuffle(order)
    first, second = model_after(name, history), model_after(name, history)
    straight = first.clip_batch(batch)
    shuffled = second.clip_batch([batch[i] for i in order])
    assert [r.value for r in shuffled] == [straight[i].value for i in order]  # type: ignore[union-attr]
    assert sorted(first.window("t")) == sorted(second.window("t"))
    by_speed = sorted(zip(speeds, (r.value for r in straight)))  # type: ignore[union-attr]
    assert all(a[1] <= b[1] for a, b in itertools.pairwise(by_speed))


def test_a_group_clipped_one_at_a_time_no_longer_reorders_it():
    """The 7B reward config, a window of earlier 1.0-1.3x results, then a group of 4x, 2x, 1.5x and
    1.05x kernels: clipping one result at a time (appending as it went) paid the 4x kernel less
    than the 1.5x one; as one batch the order is the speedups'."""
    model = RewardModel(load_train_config("qwen7b-lora-1gpu").reward)
    for s in (1.0, 1.1, 1.2, 1.3, 1.0, 1.1, 1.2, 1.3):
        model.score(correct(s), level=1)
    group = [model.raw(correct(s)) for s in (4.0, 2.0, 1.5, 1.05)]
    values = [r.value for r in model.clip_batch([(r, "t", 1) for r in group])]  # type: ignore[union-attr]
    assert values == sorted(values, reverse=True)


def test_a_copy_of_a_shown_version_is_paid_the_lower_of_its_measure_and_no_speedup():
    model = RewardModel(RewardConfig(correct_bonus=0.3, smoothing=SmoothingConfig(enabled=False)))
    fresh = model.score(correct(4.0))
    copied = model.score(correct(4.0), copy=True)
    assert fresh is not None and copied is not None
    assert fresh.value == pytest.approx(0.3 + math.log(4.0)) and not fresh.copy
    assert copied.value == pytest.approx(0.3) and copied.copy and copied.speedup == 1.0
    slow = model.score(correct(0.4, ci=(0.38, 0.42)), copy=True)  # a slow version shown for contrast, copied
    assert slow is not None and slow.copy and slow.value == pytest.approx(0.3 + math.log(0.4))
    honest = model.score(correct(0.4, ci=(0.38, 0.42)))
    assert honest is not None and slow.value == honest.value  # never paid more than writing it honestly
    wrong = model.score(EvalResult(task="t", status=Status.INCORRECT), copy=True)
    assert wrong is not None and wrong.value == Penalties().incorrect and not wrong.copy  # a failure stays a failure


def test_a_reward_read_back_from_its_dict_is_the_same_reward():
    # the HTTP sessions store each turn's reward as its dict and read it back typed
    from kernelrl.reward import Reward

    model = RewardModel(RewardConfig(smoothing=SmoothingConfig(window=8, min_samples=2)))
    made = [model.score(correct(s, ci=(s * 0.9, s * 1.1), band=(0.97, 1.03))) for s in (1.0, 1.2, 1.5, 9.0)]
    made += [model.score(EvalResult(task="t", status=Status.FLAGGED)), model.score(None, answer="no code")]
    for reward in made:
        assert reward is not None and Reward.from_dict(reward.to_dict()) == reward
    assert any(r is not None and r.band is not None for r in made) and any(r is not None and r.clipped for r in made)


# -- the clip damps and never lifts: properties over random windows and groups --------------------

windows_of = st.lists(st.floats(min_value=-1.0, max_value=3.0, allow_nan=False), min_size=0, max_size=40)
groups_of = st.lists(st.floats(min_value=0.05, max_value=50.0, allow_nan=False), min_size=2, max_size=16)


@settings(max_examples=300, deadline=None)
@given(name=configs, window=windows_of, group=groups_of, failure=st.sampled_from(FAILURES))
def test_the_clip_never_raises_a_reward_and_never_reorders(name, window, group, failure):
    model = RewardModel(CONFIGS[name])
    model.load_state({"tasks": {"t": window}, "levels": []})
    raws = [model.raw(correct(s), compile_speedup=1.5) for s in group]
    fail = model.raw(EvalResult(task="t", status=failure))
    out = model.clip_batch([(r, "t", None) for r in [*raws, fail]])
    for r, v in zip(raws, out):
        assert v is not None and r is not None and v.value <= r.raw + 1e-12  # never raised
    values = [v.value for v in out[:-1]]  # type: ignore[union-attr]
    for (a, va), (b, vb) in itertools.combinations(zip(raws, values), 2):
        if a.raw < b.raw:  # type: ignore[union-attr]
            assert va <= vb + 1e-12  # never reordered
    assert out[-1] is not None and out[-1].value == fail.raw  # penalties are not clipped
    assert min(values) > out[-1].value  # every correct result still above the failure


def advantages(values: list[float]) -> list[float]:
    """TRL's advantage with scale_rewards = "group": (r - mean) / (std + 1e-4), std unbiased."""
    mean = statistics.fmean(values)
    std = statistics.stdev(values)
    return [(v - mean) / (std + 1e-4) for v in values]


@settings(max_examples=300, deadline=None)
@given(name=configs, window=windows_of, fast=st.floats(min_value=1.2, max_value=20.0),
       slow=st.floats(min_value=0.1, max_value=1.0), n_fast=st.integers(1, 12), n_slow=st.integers(1, 3))
def test_speed_stays_in_the_advantage_of_a_group_that_holds_a_failure(name, window, fast, slow, n_fast, n_slow):
    """The gap between the fastest and slowest correct answer's advantage is, as a share of the gap
    between the slowest correct answer and a failure, (min(r_fast, top) - r_slow) / (r_slow - penalty):
    the unclipped share when the fast answer is inside the band, never less than at the band's top."""
    model = RewardModel(CONFIGS[name])
    model.load_state({"tasks": {"t": window}, "levels": []})
    r_fast, r_slow = model.raw(correct(fast), compile_speedup=1.5), model.raw(correct(slow), compile_speedup=1.5)
    fail = model.raw(EvalResult(task="t", status=Status.COMPILE_ERROR))
    assert r_fast is not None and r_slow is not None and fail is not None
    band = model.windows.band("t", None, model.config.smoothing) if model.config.smoothing.enabled else None
    batch = [r_fast] * n_fast + [r_slow] * n_slow + [fail]
    out = [v.value for v in model.clip_batch([(r, "t", None) for r in batch])]  # type: ignore[union-attr]
    adv = advantages(out)
    a_fast, a_slow, a_fail = adv[0], adv[n_fast], adv[-1]
    top = band[1] if band is not None else math.inf
    if r_fast.raw <= r_slow.raw:
        return  # the mapping held both at one value (the floor or the cap)
    expected = (min(r_fast.raw, max(top, r_slow.raw)) - r_slow.raw) / (r_slow.raw - fail.raw)
    assert (a_fast - a_slow) / (a_slow - a_fail) == pytest.approx(expected, rel=1e-6, abs=1e-9)
    if r_slow.raw < top:
        assert a_fast > a_slow  # speed is still paid


def test_a_converged_window_keeps_a_slow_answer_below_a_fast_one():
    """The issue's case: every fast answer had the same raw value (sigma 0); a slow correct answer
    in a group with a failure is paid its own raw reward, not lifted to the mean."""
    model = RewardModel(load_train_config("qwen7b-lora-1gpu").reward)
    fast = model.raw(correct(2.0))
    assert fast is not None
    model.load_state({"tasks": {"t": [fast.raw] * 64}, "levels": []})
    slow = model.raw(correct(1.0))
    fail = model.raw(EvalResult(task="t", status=Status.COMPILE_ERROR))
    out = model.clip_batch([(fast, "t", None), (slow, "t", None), (fail, "t", None)])
    assert [v.value for v in out] == [fast.raw, slow.raw, fail.raw]  # type: ignore[union-attr]
