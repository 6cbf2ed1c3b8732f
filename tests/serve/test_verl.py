"""verl's custom reward, in-process and through the reward server."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from serve_helpers import TINY_CORRECT, TINY_WRONG, TOKEN

from kernelrl.reward import Penalties
from kernelrl.serve import verl
from kernelrl.serve.verl import (
    SCORE_KEYS,
    VerlSettings,
    compute_score,
    compute_score_batch,
)


def answer(code: str) -> str:
    return f"The relu and the scale fuse into one pass.\n\n```python\n{code}\n```\n"


QUICK_EVAL = {"timeout_s": 120.0, "timing": {"min_rounds": 5, "max_rounds": 40, "max_timing_s": 2.0,
                                             "warmup_calls": 2, "min_spot_checks": 2}}


def test_settings_from_kwargs_then_environment() -> None:
    env = {verl.ENV_URL: "http://127.0.0.1:9", verl.ENV_TOKEN_FILE: "/tmp/t"}
    s = VerlSettings.resolve({}, env)
    assert (s.url, s.token_file) == ("http://127.0.0.1:9", "/tmp/t")
    s = VerlSettings.resolve({"url": "http://127.0.0.1:7", "reward": {"correct_bonus": 0.3}}, env)
    assert s.url == "http://127.0.0.1:7" and s.reward == '{"correct_bonus": 0.3}'
    assert VerlSettings.resolve({}, {}).url is None  # no URL anywhere: in-process
    with pytest.raises(TypeError, match="eval must be a table"):
        VerlSettings.resolve({"eval": "cuda"}, {})
    with pytest.raises(TypeError, match="timeout_s must be a positive number"):
        VerlSettings.resolve({"timeout_s": "soon"}, {})
    assert VerlSettings.resolve({"timeout_s": 90}, {}).timeout_s == 90.0


def test_keywords_verl_adds_are_accepted(caplog: pytest.LogCaptureFixture) -> None:
    """verl's reward loop calls compute_score(data_source=..., solution_str=..., ground_truth=...,
    extra_info=..., reward_router_address=..., reward_model_tokenizer=...): the extra keywords do
    not change the settings; one we do not know is named in a warning, once."""
    plain = VerlSettings.resolve({"url": "http://127.0.0.1:7"}, {})
    verl_call = {"url": "http://127.0.0.1:7", "reward_router_address": "10.0.0.1:30000",
                 "reward_model_tokenizer": object()}
    with caplog.at_level("WARNING", logger="kernelrl.serve"):
        assert VerlSettings.resolve(verl_call, {}) == plain
        assert not caplog.records
        assert VerlSettings.resolve({**verl_call, "adress": "x"}, {}) == plain
        assert VerlSettings.resolve({**verl_call, "adress": "x"}, {}) == plain
    assert [r.getMessage() for r in caplog.records] == [
        "kernelrl reward: ignoring keyword(s) adress (the settings are url, token_file, timeout_s, eval, reward)"]


def test_the_server_s_client_times_out_by_default() -> None:
    from kernelrl.backends.client import DEFAULT_TIMEOUT_S

    used = verl.scorer(VerlSettings.resolve({"url": "http://127.0.0.1:7"}, {}))
    assert used.backend.config.timeout_s == DEFAULT_TIMEOUT_S
    assert verl.scorer(VerlSettings.resolve({"url": "http://127.0.0.1:7", "timeout_s": 90}, {})
                       ).backend.config.timeout_s == 90.0


def test_in_process(cache_dir: Path, tiny_task) -> None:
    kwargs = {"eval": {**QUICK_EVAL, "cache_dir": str(cache_dir)}}
    extra = {"task_name": "tiny", "level": 1}
    right, wrong, no_code = compute_score_batch(
        ["kernelrl"] * 3, [answer(TINY_CORRECT), answer(TINY_WRONG), "I would fuse them."],
        [tiny_task.source] * 3, [extra] * 3, **kwargs)
    for d in (right, wrong, no_code):
        assert tuple(d) == SCORE_KEYS and all(isinstance(v, float) for v in d.values())
    assert right["correct"] == 1.0 and right["scored"] == 1.0
    assert math.isfinite(right["score"]) and right["score"] == right["raw"]  # log(speedup), window empty
    assert abs(right["score"]) < math.log(3)  # the same program as the reference: about 1x
    assert wrong == {"score": Penalties().incorrect, "raw": Penalties().incorrect, "clipped": 0.0, "correct": 0.0,
                     "scored": 1.0}
    assert no_code["score"] == Penalties().no_code and no_code["correct"] == 0.0
    # The per-sample function shares the scorer (and its evaluator's cache), called as verl's
    # reward loop calls it (keywords only, its own extra ones included).
    single = compute_score(data_source="kernelrl", solution_str=answer(TINY_WRONG), ground_truth=tiny_task.source,
                           extra_info={**extra, "num_turns": 1, "rollout_reward_scores": {}},
                           reward_router_address=None, reward_model_tokenizer=None, **kwargs)
    assert single == wrong
    with pytest.raises(ValueError, match="ground truth is not a task"):
        compute_score("kernelrl", answer(TINY_CORRECT), "no_such_task", None, **kwargs)


def test_through_the_server(real_server, tiny_task) -> None:
    token_file = Path(real_server.config.token_file)
    assert token_file.read_text().strip() == TOKEN
    scores = compute_score_batch(["kernelrl"] * 2, [answer(TINY_CORRECT), answer(TINY_WRONG)], [tiny_task.source] * 2,
                                 [{"task_name": tiny_task.name}] * 2, url=real_server.url, token_file=str(token_file),
                                 reward={"correct_bonus": 0.3})
    assert scores[0]["correct"] == 1.0 and scores[0]["scored"] == 1.0
    assert scores[1]["score"] == Penalties().incorrect
    used = verl.scorer(VerlSettings.resolve({"url": real_server.url, "token_file": str(token_file),
                                             "reward": {"correct_bonus": 0.3}}))
    assert used.model.config.correct_bonus == 0.3 and type(used.backend).__name__ == "RewardClient"
    # the bonus is in the score: log(speedup) + 0.3, with the same program as the reference (about 1x)
    assert abs(scores[0]["raw"] - 0.3) < math.log(3)
