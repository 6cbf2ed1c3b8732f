"""The session store alone: owners, the order of turns, a verdict recorded once, retention."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kernelrl.backends.api import TurnState
from kernelrl.checks.policy import PolicyName
from kernelrl.episodes.episode import EpisodeConfig
from kernelrl.result import EvalResult, Status
from kernelrl.reward import Reward
from kernelrl.serve.session_store import SessionLimit, SessionStore, TurnRefused
from kernelrl.tasks.task import Size, Task

TASK = Task(name="t", source="import torch\n")


@pytest.fixture
def store(tmp_path: Path):
    s = SessionStore(tmp_path / "serve.db")  # its own server store: the file, private, with every table
    yield s
    s.close()


def new(store: SessionStore, owner: str = "alice", turns: int = 2, **kw):
    return store.create(owner=owner, task=TASK, size=Size.SMALL, policy=PolicyName.OPEN,
                        episode=EpisodeConfig(turns=turns), profile_job=None, **kw)


def test_a_session_is_its_owners_and_a_key_returns_it(store: SessionStore) -> None:
    s = new(store, key="k")
    assert store.get(s.id, owner="alice") is not None and store.get(s.id, owner="bob") is None
    assert not store.close_session(s.id, owner="bob") and store.get(s.id, owner="alice").closed_s is None
    assert new(store, key="k").id == s.id and new(store, owner="bob", key="k").id != s.id
    with pytest.raises(SessionLimit):
        new(store, max_open=1)  # alice has one open
    assert store.close_session(s.id, owner="alice")
    assert new(store, max_open=1).id != s.id


def _reward(value: float, status: Status | None) -> Reward:
    return Reward(value=value, raw=value, clipped=False, band=None, status=status, speedup=None, within_noise=False,
                  parts={"speedup": value})


def test_turns_in_order_one_pending_at_a_time_and_a_failed_turn_taken_again(store: SessionStore) -> None:
    s = new(store, turns=2)
    with pytest.raises(TurnRefused, match="next turn is 1"):
        store.add_turn(s.seq, 2, answer="a", code="c", key="k2")
    store.add_turn(s.seq, 1, answer="a", code="c", key="k1")
    with pytest.raises(TurnRefused, match="still being judged"):
        store.add_turn(s.seq, 2, answer="a", code="c2", key="k2")
    assert store.finish_turn(s.seq, 1, error="the job failed")
    assert store.get(s.id, owner="alice").turns[0].state is TurnState.FAILED
    store.add_turn(s.seq, 1, answer="b", code="c", key="k1b")  # the failed turn is replaced
    correct = EvalResult(task="t", status=Status.CORRECT, speedup=1.5, speedup_ci=(1.4, 1.6))
    assert store.finish_turn(s.seq, 1, result=correct, verdict="Correct.", reward=_reward(1.0, Status.CORRECT))
    assert not store.finish_turn(s.seq, 1, result=EvalResult(task="t", status=Status.INCORRECT), verdict="x",
                                 reward=_reward(-1.0, Status.INCORRECT))
    turn = store.get(s.id, owner="alice").turns[0]
    assert (turn.answer, turn.verdict, turn.reward, turn.result) == ("b", "Correct.", _reward(1.0, Status.CORRECT),
                                                                    correct)  # read back typed, as stored
    store.add_turn(s.seq, 2, answer="no code", code=None, key=None, verdict="No code", reward=_reward(-1.0, None))
    rec = store.get(s.id, owner="alice")
    assert rec.turns[1].result is None and rec.turns[1].reward == _reward(-1.0, None)
    assert rec.done and rec.next_turn == 3 and [t.state for t in rec.turns] == [TurnState.JUDGED] * 2
    with pytest.raises(TurnRefused, match="episode is done"):
        store.add_turn(s.seq, 3, answer="a", code="c", key="k3")


def test_purge_removes_idle_sessions_but_not_one_being_judged(store: SessionStore) -> None:
    idle, busy = new(store), new(store)
    store.add_turn(busy.seq, 1, answer="a", code="c", key="k")
    assert store.purge(idle_before_s=time.time() + 1) == 1
    assert store.get(idle.id, owner="alice") is None and store.get(busy.id, owner="alice") is not None
