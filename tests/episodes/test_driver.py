"""The episode driver (`kernelrl.episodes.driver`): one turn loop for the bench and multi-turn
GRPO; the older flat `turns` / `history_tokens` keys of a run config moved into `[episode]`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kernelrl.episodes.driver import Judgement, run_episodes, turn_prompt
from kernelrl.episodes.episode import Episode, EpisodeConfig, nest_episode_keys
from kernelrl.result import EvalResult, Status

BASE = "Make t faster."


def result(status: Status, speedup: float | None = None) -> EvalResult:
    return EvalResult(status=status, task="t", speedup=speedup)


def test_each_turn_is_asked_its_history_judged_in_one_batch_and_paid_its_return() -> None:
    episodes = [Episode(task="t", config=EpisodeConfig(turns=3, gamma=0.5)) for _ in range(2)]
    asked: list[tuple[int, list[int], list[Any]]] = []
    judged: list[tuple[int, list[int], list[str]]] = []
    script = {0: ["a1", "a2", None], 1: ["b1", "b2", "b3"]}  # episode 0's proposer runs out at turn 3

    def ask(turn: int, live: Sequence[int], prompts: Sequence[Any]) -> list[str | None]:
        asked.append((turn, list(live), list(prompts)))
        return [script[i][turn - 1] for i in live]

    def judge(turn: int, which: Sequence[int], prompts: Sequence[Any], answers: Sequence[str]) -> list[Judgement]:
        judged.append((turn, list(which), list(answers)))
        return [Judgement(code=f"code {a}", result=result(Status.CORRECT, 2.0), candidate_id=10 * turn + i,
                          reward=float(turn)) for i, a in zip(which, answers)]

    returns = run_episodes(episodes, [BASE, [{"role": "system", "content": "s"}, {"role": "user", "content": BASE}]],
                           ask=ask, judge=judge)
    assert [(t, live) for t, live, _ in asked] == [(1, [0, 1]), (2, [0, 1]), (3, [0, 1])]
    assert [(t, w) for t, w, _ in judged] == [(1, [0, 1]), (2, [0, 1]), (3, [1])]
    first, second = asked[0][2], asked[1][2]
    assert first[0] == BASE and first[1][1]["content"] == BASE  # turn 1: the base itself
    assert "code a1" in second[0] and "## Turn 2 of 3" in second[0]
    assert second[1][0] == {"role": "system", "content": "s"} and "code b1" in second[1][1]["content"]
    assert [len(ep.turns) for ep in episodes] == [2, 3]
    assert episodes[1].parents == (31,) and episodes[0].parents == (20,)
    assert returns == [[1.0 + 0.5 * 2.0, 2.0], [1.0 + 0.5 * (2.0 + 0.5 * 3.0), 2.0 + 0.5 * 3.0, 3.0]]


def test_the_driver_refuses_a_miscount_and_a_started_episode() -> None:
    ep = Episode(task="t", config=EpisodeConfig(turns=2))
    with pytest.raises(ValueError, match="1 answers for 2 prompts"):
        run_episodes([ep, Episode(task="t", config=EpisodeConfig(turns=2))], [BASE, BASE],
                     ask=lambda turn, live, prompts: ["x"], judge=lambda *a: [])
    ep.record("no code", None, None)
    with pytest.raises(ValueError, match="fresh"):
        run_episodes([ep], [BASE], ask=lambda *a: [], judge=lambda *a: [])
    assert turn_prompt(Episode(task="t"), BASE) == BASE


def test_stored_verdict_and_reward_are_kept_when_an_episode_is_restored() -> None:
    ep = Episode(task="t", config=EpisodeConfig(turns=2, gamma=0.4))
    ep.record("a", "code", result(Status.INCORRECT), verdict="as stored", reward=-1.0)
    assert ep.turns[0].verdict == "as stored" and "as stored" in ep.prompt(BASE)
    assert ep.returns() == [-1.0] and ep.returns([2.0]) == [2.0]


def test_older_flat_turn_keys_move_into_the_episode_table(tmp_path: Path) -> None:
    from kernelrl.cli.search import SEARCH_FLAGS, search_config
    from kernelrl.cli.train import BENCH_FLAGS

    assert nest_episode_keys({"budget": 2}) == {"budget": 2}
    assert nest_episode_keys({"turns": 3, "history_tokens": 900, "episode": {"gamma": 0.2}}) == {
        "episode": {"gamma": 0.2, "turns": 3, "history_tokens": 900}}
    with pytest.raises(ValueError, match="both"):
        nest_episode_keys({"turns": 3, "episode": {"turns": 2}})
    for table in (SEARCH_FLAGS, BENCH_FLAGS):
        assert table.flag_name("episode.turns") == "--turns"
        assert table.flag_name("episode.history_tokens") == "--history-tokens"
    old = tmp_path / "old.toml"
    old.write_text('tasks = ["softmax"]\nturns = 3\nhistory_tokens = 900\n')
    from kernelrl.cli import build_parser

    args = build_parser().parse_args(["optimize", "--config", str(old), "--db", str(tmp_path / "r.db")])
    assert search_config(args).episode == EpisodeConfig(turns=3, history_tokens=900)
    args = build_parser().parse_args(["optimize", "--config", str(old), "--db", str(tmp_path / "r.db"),
                                      "--turns", "2"])
    assert search_config(args).episode.turns == 2
