"""The TRL reward function (`kernelrl.train.reward_fn.KernelRewardFunction`) with the reward
server's client as its backend, against a live server with the real evaluator."""

from __future__ import annotations

import pytest
from serve_helpers import TINY_CORRECT, TINY_WRONG, TOKEN, fast_client

from kernelrl.reward import Penalties, RewardModel
from train_fixtures import run_parts

reward_fn = pytest.importorskip("kernelrl.train.reward_fn")


def test_trl_reward_function_through_the_server(real_server, tiny_task) -> None:
    client = fast_client(real_server.url, token=TOKEN, wait_s=10.0)
    fn = reward_fn.KernelRewardFunction(run_parts([tiny_task], client), shaping=reward_fn.RewardShaping(reward=RewardModel()))
    before = real_server.service.store.stats(since=0)
    completions = [f"Fused.\n```python\n{TINY_CORRECT}\n```", f"```python\n{TINY_WRONG}\n```", "no code at all"]
    values = fn(prompts=["p"] * 3, completions=completions, task=[tiny_task.name] * 3)
    assert len(values) == 3 and all(isinstance(v, float) for v in values)
    assert values[1] == Penalties().incorrect and values[2] == Penalties().no_code
    assert values[0] > Penalties().compile_error  # correct: log(speedup), about 0 for the same program
    after = real_server.service.store.stats(since=0)
    # judged by the server, in one job of the two answers that hold code
    assert after.jobs["done"] == before.jobs["done"] + 1
    assert sum(after.by_status.values()) == sum(before.by_status.values()) + 2


def test_the_trainer_s_client_times_out_by_default(tmp_path) -> None:
    import math

    from kernelrl.backends.client import DEFAULT_TIMEOUT_S, RewardClient
    from kernelrl.backends.judges import BackendConfig, make_judge
    from kernelrl.train.model import ModelConfig
    from kernelrl.train.recipe import TrainConfig

    def client_timeout(backend: BackendConfig) -> float:
        config = TrainConfig(tasks=("softmax",), output_dir=tmp_path, model=ModelConfig(path="unused"), backend=backend)
        client = make_judge(config.eval, config.backend)
        assert isinstance(client, RewardClient)
        client.close()
        return client.config.timeout_s

    assert client_timeout(BackendConfig(url="http://127.0.0.1:9")) == DEFAULT_TIMEOUT_S
    assert math.isfinite(DEFAULT_TIMEOUT_S)
    assert client_timeout(BackendConfig(url="http://127.0.0.1:9", timeout_s=60.0)) == 60.0
