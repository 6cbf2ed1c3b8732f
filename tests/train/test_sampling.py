"""Rejection-sampling's sampling: the work split across ranks without duplicates, `generate` on the
CPU, the vLLM engines against a stand-in `vllm` module (vLLM itself is not installed here), and
(slow) two processes running two rounds of `kernelrl train rft --config tiny-cpu`."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from collections import Counter
from typing import ClassVar

import pytest

from kernelrl.store import Database
from kernelrl.train.model import ModelConfig
from kernelrl.train.rft import Planned, RFTStageConfig, sample_share
from kernelrl.train.sampling import Engine, SamplingConfig, resolve_engine, share
from train_fixtures import launch_stage, run_ranks

PLAN = [Planned(task="toy/a", prompt="# Task: a", parents=(), count=5),
        Planned(task="toy/b", prompt="# Task: b", parents=(7,), count=2)]


def test_share_is_disjoint_and_whole():
    items = list(range(11))
    parts = run_ranks(3, lambda ranks: share(items, ranks))
    assert sorted(x for part in parts for x in part) == items and [len(p) for p in parts] == [4, 4, 3]


@pytest.fixture
def tiny_model(tmp_path, tiny_task):
    from kernelrl.train.tiny import build_tiny_model

    return build_tiny_model(tmp_path / "base", [tiny_task])


def test_generate_on_the_cpu_splits_a_round_across_ranks(tiny_model):
    stage = RFTStageConfig(samples_per_task=5, max_new_tokens=4, temperature=1.0, sampling=SamplingConfig(engine="hf"))
    model = ModelConfig(path=str(tiny_model), dtype="float32")
    per_rank = run_ranks(2, lambda ranks: sample_share(stage, model, str(tiny_model), PLAN, ranks, seed=1))
    counts = [Counter(r.task for r in part) for part in per_rank]
    assert counts[0] + counts[1] == Counter({"toy/a": 5, "toy/b": 2})  # every sample once, none twice
    assert counts[0] == Counter({"toy/a": 3, "toy/b": 1}) and counts[1] == Counter({"toy/a": 2, "toy/b": 1})
    assert all(r.prompt == f"# Task: {r.task[-1]}" and r.parents == (() if r.task == "toy/a" else (7,))
               for part in per_rank for r in part)


class FakeLLM:
    """Stands in for `vllm.LLM`: records its settings and what it was asked."""

    made: ClassVar[list[dict]] = []
    asked: ClassVar[list[tuple[list[str], int]]] = []

    def __init__(self, **kwargs):
        FakeLLM.made.append(kwargs)

    def generate(self, prompts, params, use_tqdm=False):
        FakeLLM.asked.append((list(prompts), params.n))
        out = types.SimpleNamespace
        return [out(prompt_token_ids=[1, 2, 3], outputs=[out(text=f"answer {p[-1]} {k}", token_ids=[5] * 4,
                                                             finish_reason="length" if k else "stop")
                                                         for k in range(params.n)]) for p in prompts]


class FakeSamplingParams:
    def __init__(self, *, n, temperature, max_tokens):
        self.n, self.temperature, self.max_tokens = n, temperature, max_tokens


def test_vllm_colocated_on_each_rank(monkeypatch, tiny_model):
    fake = types.ModuleType("vllm")
    fake.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    fake.LLM, fake.SamplingParams = FakeLLM, FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", fake)
    FakeLLM.made.clear()
    FakeLLM.asked.clear()
    stage = RFTStageConfig(samples_per_task=5, max_new_tokens=8, sampling=SamplingConfig(
        engine="vllm", vllm_gpu_memory_utilization=0.5))
    model = ModelConfig(path=str(tiny_model), dtype="bfloat16")
    per_rank = run_ranks(2, lambda ranks: sample_share(stage, model, str(tiny_model), PLAN, ranks, seed=3))
    assert sorted(m["seed"] for m in FakeLLM.made) == [3, 4]  # one engine per rank, its own seed
    assert all(m["distributed_executor_backend"] == "external_launcher" and m["tensor_parallel_size"] == 1
               and m["gpu_memory_utilization"] == 0.5 and m["dtype"] == "bfloat16" for m in FakeLLM.made)
    assert sorted(n for _, n in FakeLLM.asked) == [1, 1, 2, 3]  # a: 3 + 2, b: 1 + 1
    samples = [r for part in per_rank for r in part]
    assert Counter(r.task for r in samples) == Counter({"toy/a": 5, "toy/b": 2})
    assert all(r.prompt_tokens == 3 and r.completion_tokens == 4 for r in samples)


def test_the_engine_is_chosen_by_what_is_installed(monkeypatch):
    assert resolve_engine(SamplingConfig(engine="hf")) is Engine.HF
    monkeypatch.setitem(sys.modules, "vllm", None)  # not importable
    assert resolve_engine(SamplingConfig()) is Engine.HF  # auto: the CPU fallback
    with pytest.raises(ValueError):
        SamplingConfig(vllm_mode="remote")


@pytest.mark.slow
def test_two_processes_run_two_rft_rounds_without_duplicates(tmp_path, cache_dir, tiny_task):
    run = tmp_path / "run"
    done = launch_stage("rft", run, cache_dir, "--tasks", str(tiny_task.path), "--rft.samples-per-task", "5")
    assert done.returncode == 0, done.stderr[-3000:]
    with Database(run / "code.db", readonly=True) as db:
        rows = db.candidates()
        assert len(db.runs()) == 1
    for r in (1, 2):
        mine = [c for c in rows if c.proposer == f"rft:round-{r}"]
        assert len(mine) == 5 and Counter(c.meta.rank for c in mine) == Counter({0: 3, 1: 2})
