"""Every judge is built from its config in one place: a client when a server's address is given, else an
in-process evaluator; each caller (a run, verl's reward, a server lane) gets its judge there."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelrl.backends.client import RewardClient
from kernelrl.backends.judges import BackendConfig, make_judge
from kernelrl.checks.policy import PolicyName
from kernelrl.judge.eval_config import EvalConfig
from kernelrl.serve import lanes as lanes_module
from kernelrl.serve import verl
from kernelrl.serve.lanes import LaneEvaluators
from kernelrl.serve.verl import VerlSettings
from kernelrl.tasks.task import Size

URL = "http://127.0.0.1:9"  # never contacted: a client is made, no request is sent


def test_no_address_makes_an_in_process_evaluator_of_the_config(cache_dir: Path) -> None:
    from kernelrl.judge.evaluator import Evaluator

    config = EvalConfig(size=Size("small"), cache_dir=cache_dir)
    judge = make_judge(config, BackendConfig())
    try:
        assert isinstance(judge, Evaluator) and judge.config == config
    finally:
        judge.close()


def test_a_client_asks_for_the_configs_size_and_policy_unless_they_are_left_to_the_server() -> None:
    config = EvalConfig(size=Size("full"), policy=PolicyName("strict"))
    asked = make_judge(config, BackendConfig(url=URL, timeout_s=30))
    left = make_judge(config, BackendConfig(url=URL), server_chooses=("size", "policy"))
    for judge in (asked, left):
        judge.close()
    assert isinstance(asked, RewardClient) and isinstance(left, RewardClient)
    assert (asked.config.size, asked.config.policy, asked.config.timeout_s) == ("full", "strict", 30)
    assert (left.config.size, left.config.policy) == (None, None)
    with pytest.raises(ValueError, match="server's to choose, not \\['device'\\]"):
        make_judge(config, BackendConfig(url=URL), server_chooses=("device",))


def test_verl_leaves_to_the_server_what_its_eval_table_does_not_name() -> None:
    named = verl.scorer(VerlSettings.resolve({"url": URL, "eval": {"size": "full"}}, {}))
    unnamed = verl.scorer(VerlSettings.resolve({"url": URL}, {}))
    assert isinstance(named.backend, RewardClient) and isinstance(unnamed.backend, RewardClient)
    assert (named.backend.config.size, named.backend.config.policy) == ("full", None)
    assert (unnamed.backend.config.size, unnamed.backend.config.policy) == (None, None)


def test_a_lane_makes_one_judge_per_size_and_policy_through_the_builder(monkeypatch) -> None:
    made: list[EvalConfig] = []

    class Judge:
        closed = False

        def close(self) -> None:
            self.closed = True

    def make(config: EvalConfig, backend: BackendConfig | None = None, **_: object) -> Judge:
        assert backend is None  # a lane judges in its own process
        made.append(config)
        return Judge()

    monkeypatch.setattr(lanes_module, "make_judge", make)
    lane = LaneEvaluators(EvalConfig(size=Size("small"), policy=PolicyName("open")))
    first = lane.evaluator()
    assert lane.evaluator() is first and lane.evaluator(Size("small"), PolicyName("open")) is first
    other = lane.evaluator(Size("full"))
    assert other is not first
    assert [(c.size, c.policy) for c in made] == [("small", "open"), ("full", "open")]
    lane.close()
    assert first.closed and other.closed
