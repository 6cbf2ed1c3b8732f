"""Refinement episodes: turn prompts carry earlier answers and verdicts within a budget; returns
follow Kevin's discounted sum."""

from __future__ import annotations

import pytest

from kernelrl.episodes.episode import Episode, EpisodeConfig, discounted_returns
from kernelrl.result import EvalResult, Status
from kernelrl.reward import RewardModel

BASE = "# Task: make `t` faster\n\n(the contrastive prompt)\n"
BROKEN = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.flaot()\n"
FIXED = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.float()\n"


def compile_error() -> EvalResult:
    return EvalResult(task="t", status=Status.COMPILE_ERROR,
                      message="candidate does not build: main.cpp:4:9: error: 'flaot' was not declared",
                      errors=["main.cpp:4:9: error: 'flaot' was not declared in this scope"])


def correct(speedup: float) -> EvalResult:
    return EvalResult(task="t", status=Status.CORRECT, speedup=speedup, speedup_ci=(speedup * 0.98, speedup * 1.02))


def test_the_first_turn_is_the_base_prompt_and_turn_two_holds_turn_ones_compiler_error():
    ep = Episode(task="t", config=EpisodeConfig(turns=2))
    assert ep.prompt(BASE) == BASE and ep.turn == 1 and not ep.done
    ep.record("```python\n" + BROKEN + "```", BROKEN, compile_error())
    second = ep.prompt(BASE)
    assert second.startswith(BASE.rstrip("\n"))
    assert "### Turn 1" in second and BROKEN.strip() in second
    assert "'flaot' was not declared in this scope" in second and "## Turn 2 of 2" in second
    ep.record("```python\n" + FIXED + "```", FIXED, correct(1.5))
    assert ep.done
    with pytest.raises(ValueError, match="already has"):
        ep.record("again", FIXED, correct(1.5))


def test_a_turn_prompt_ends_with_what_the_last_verdict_asks_for():
    failed = Episode(task="t", config=EpisodeConfig(turns=3))
    failed.record("```python\n" + BROKEN + "```", BROKEN, compile_error())
    assert failed.prompt(BASE).rstrip().endswith("Turn 1 failed (compile error): fix what its verdict says first.")
    failed.record("no code here", None, None)
    assert failed.prompt(BASE).rstrip().endswith("Turn 2 failed (no code): fix what its verdict says first.")
    right = Episode(task="t", config=EpisodeConfig(turns=2))
    right.record("```python\n" + FIXED + "```", FIXED, correct(1.5))
    assert right.prompt(BASE).rstrip().endswith("Turn 1 is correct: make it faster while keeping it correct.")


def test_a_turn_has_a_result_exactly_when_it_has_code():
    ep = Episode(task="t", config=EpisodeConfig(turns=3))
    with pytest.raises(ValueError):
        ep.record("answer", None, correct(1.0))
    ep.record("no code here", None, None)
    assert "no complete fenced code block" in ep.prompt(BASE)


def test_older_turns_are_summarised_then_dropped_to_fit_the_budget():
    ep = Episode(task="t", config=EpisodeConfig(turns=8, history_tokens=230))
    long_code = FIXED + "# padding\n" * 60  # far more than the budget in full
    for i in range(5):
        ep.record("a", long_code, correct(1.0 + i / 10))
    text = ep.prompt(BASE)
    assert text.count("```python") == 1  # the latest turn only, in full
    assert "### Turn 5" in text and "(code not repeated)" in text
    assert "Turn 4 (code not repeated): correct, 1.30x" in text and "(3 earlier turns not shown.)" in text


def test_discounted_returns_pay_earlier_turns_part_of_later_success():
    assert discounted_returns([1.0], 0.4) == [1.0]
    got = discounted_returns([-2.5, 0.5, 1.0], 0.4)
    assert got == pytest.approx([-2.5 + 0.4 * 0.5 + 0.16 * 1.0, 0.5 + 0.4 * 1.0, 1.0])
    # a turn with no reward has no return and passes nothing back
    # a turn without a reward has no return, and neither has any turn before it (it would hold a
    # reward nobody measured); the turns after it keep theirs
    assert discounted_returns([-1.0, None, 2.0], 0.4) == [None, None, 2.0]
    assert discounted_returns([-1.0, 0.5, None], 0.4) == [None, None, None]
    assert discounted_returns([None, 0.5, 1.0], 0.4) == [None, pytest.approx(0.9), 1.0]
    assert discounted_returns([1.0, 2.0], 0.0) == [1.0, 2.0]
    with pytest.raises(ValueError):
        discounted_returns([1.0], 1.5)


def test_a_two_turn_episode_that_fails_then_succeeds_gets_the_documented_rewards():
    model = RewardModel()
    ep = Episode(task="t", config=EpisodeConfig(turns=2))
    first, second = compile_error(), correct(2.0)
    ep.record("a", BROKEN, first)
    ep.record("b", FIXED, second)
    r1, r2 = model.raw(first), model.raw(second)
    assert r1 is not None and r2 is not None
    returns = ep.returns([r1.raw, r2.raw])
    assert returns[1] == pytest.approx(r2.raw)
    assert returns[0] == pytest.approx(r1.raw + 0.4 * r2.raw)
    assert returns[0] > r1.raw  # the failed turn is credited with part of the fix it led to


def test_config_is_validated():
    for bad in ({"turns": 0}, {"history_tokens": 10}, {"gamma": -0.1}):
        with pytest.raises(ValueError):
            EpisodeConfig(**bad)
