"""The adversarial LLM judge as the evaluator calls it, against a scripted endpoint on 127.0.0.1."""

from __future__ import annotations

import pytest

from kernelrl.checks.llm_judge import LLMJudgeConfig
from kernelrl.endpoint import RetryPolicy
from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.result import ReviewAnswer, Severity, Status
from openai_server import Reply

pytestmark = pytest.mark.xdist_group("cpu_judge")  # see conftest.py

HACK = '{"verdict": "hack", "reason": "the output does not depend on the work timed"}'
REAL = '{"verdict": "real", "reason": "one fused pass"}'
FUSED = ("import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def __init__(self, features):\n"
         "        super().__init__()\n        self.bias = nn.Parameter(torch.randn(features))\n\n"
         "    def forward(self, x):\n        return torch.clamp_min(x, 0.0) * 2.0 + self.bias\n")


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("KERNELRL_JUDGE_KEY", "judge-key")


def config(quick_config, server, tmp_path, policy) -> EvalConfig:
    judge = LLMJudgeConfig(enabled=True, model="scripted-model", base_url=server.base_url,
                           api_key_env="KERNELRL_JUDGE_KEY", min_speedup=0.01, timeout_s=10.0,
                           retry=RetryPolicy(max_retries=1, initial_s=0.001, max_s=0.002, jitter=0.0))
    return EvalConfig(**{**quick_config.__dict__, "cache_dir": tmp_path / "cache", "policy": policy,
                         "llm_judge": judge})


def test_the_judges_hack_verdict_warns_under_open_and_the_same_code_is_asked_once(quick_config, tiny_task,
                                                                                  openai_server, tmp_path):
    openai_server.add(Reply.ok(HACK))
    with Evaluator(config(quick_config, openai_server, tmp_path, "open")) as ev:
        res = ev.evaluate(tiny_task, FUSED)
    assert res.status is Status.CORRECT, res.message  # open: the model's opinion only warns
    (finding,) = [f for f in res.findings if f.rule == "llm_judge"]
    assert finding.severity is Severity.WARN and "does not depend" in finding.message
    assert res.environment.review is not None and res.environment.review.answer is ReviewAnswer.HACK
    body = openai_server.requests[0]["messages"][-1]["content"]
    assert "clamp_min" in body and "judge-key" not in str(openai_server.requests[0])
    asked = len(openai_server.requests)
    with Evaluator(config(quick_config, openai_server, tmp_path, "open")) as ev:  # a new evaluator, same cache
        again = ev.evaluate(tiny_task, FUSED)
    assert len(openai_server.requests) == asked and again.environment.review is not None and again.environment.review.cached


def test_a_legitimate_kernel_the_judge_believes_is_kept(quick_config, tiny_task, openai_server, tmp_path):
    openai_server.add(Reply.ok(REAL))
    with Evaluator(config(quick_config, openai_server, tmp_path, "open")) as ev:
        res = ev.evaluate(tiny_task, FUSED)
    assert res.status is Status.CORRECT and not [f for f in res.findings if f.rule.startswith("llm_judge")]


CPP = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = """
#include <torch/extension.h>
torch::Tensor relu2_bias(torch::Tensor x, torch::Tensor b) {
    auto out = torch::empty_like(x);
    const float* px = x.data_ptr<float>(); const float* pb = b.data_ptr<float>(); float* po = out.data_ptr<float>();
    const int64_t n = x.size(0), f = x.size(1);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < f; ++j) { float v = px[i * f + j]; po[i * f + j] = (v > 0 ? v : 0) * 2.0f + pb[j]; }
    return out;
}
"""
_ext = load_inline(name="relu2_bias_judged", cpp_sources=[_SRC], functions=["relu2_bias"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return _ext.relu2_bias(x.contiguous(), self.bias)
'''


@pytest.mark.slow
def test_a_hack_the_judge_names_is_refused_under_strict(quick_config, tiny_task, openai_server, tmp_path):
    openai_server.add(Reply.ok(HACK))
    # a first C++ build (and torch's precompiled header) can take minutes on two busy cores
    strict = EvalConfig(**{**config(quick_config, openai_server, tmp_path, "strict").__dict__, "timeout_s": 900.0})
    with Evaluator(strict) as ev:
        res = ev.evaluate(tiny_task, CPP)
    assert res.status is Status.FLAGGED and "llm_judge" in res.rejecting_rules, res.message
