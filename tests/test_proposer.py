"""Proposers: the OpenAI-compatible client against a real local HTTP server, replay files and
folders, the heuristic portfolio (programs that run), and a tiny local Hugging Face model."""

from __future__ import annotations

import json
import random
import threading
import types

import pytest
import torch

from kernelrl.proposer import (
    Exhausted,
    HeuristicConfig,
    HeuristicProposer,
    OpenAIProposer,
    Proposal,
    ProposalRequest,
    ProposerError,
    ProposerUnavailable,
    ReplayProposer,
    RetryPolicy,
    Rewrite,
    embed_reference,
    heuristic_name,
    make_proposer,
    render_rewrite,
    task_traits,
)
from kernelrl.task import Task

try:  # the lead may turn tests/ into a package; both import styles must work
    from tests.openai_server import OpenAIServer, Reply, openai_server  # noqa: F401
except ImportError:
    from openai_server import OpenAIServer, Reply, openai_server  # noqa: F401

GOOD = ("The reference pays for autograd; this does not.\n\n```python\nimport torch\nimport torch.nn as nn\n\n"
        "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x + 1\n```\n")

LINEAR = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, dim):
        super(Model, self).__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x):
        return torch.relu(self.lin(x)) + 0.5

batch_size = 8
dim = 32

def get_inputs():
    return [torch.randn(batch_size, dim)]

def get_init_inputs():
    return [dim]
"""

CONV_BN = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))

batch_size = 4
cin = 3
cout = 8

def get_inputs():
    return [torch.randn(batch_size, cin, 16, 16)]

def get_init_inputs():
    return [cin, cout]
"""

CONV = CONV_BN.replace("        self.bn = nn.BatchNorm2d(cout)\n", "").replace("self.bn(self.conv(x))", "self.conv(x)")


def make_task(name: str = "toy/linear", source: str = LINEAR) -> Task:
    return Task(name=name, source=source)


def request(task: Task | None = None, prompt: str = "make it faster", parent: str | None = None,
            chain: int = 0, step: int = 0) -> ProposalRequest:
    return ProposalRequest(task=task or make_task(), prompt=prompt, parent=parent, chain=chain, step=step)


class RecordingSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def openai_proposer(server: OpenAIServer, **opts) -> OpenAIProposer:
    opts.setdefault("api_key", "test-key")
    opts.setdefault("base_url", server.base_url)
    opts.setdefault("backoff_initial_s", 0.01)
    opts.setdefault("backoff_max_s", 5.0)
    opts.setdefault("timeout_s", 10.0)
    proposer = make_proposer("openai:scripted-model", **opts)
    assert isinstance(proposer, OpenAIProposer)
    return proposer


# ---------------------------------------------------------------------------------------------
# openai:MODEL


def test_openai_success_records_prompt_tokens_and_key(openai_server):
    openai_server.add(Reply.ok(GOOD, prompt_tokens=123, completion_tokens=45))
    proposer = openai_proposer(openai_server, temperature=0.2, max_tokens=777)
    p = proposer.propose(request(prompt="PROMPT-MARKER reference here"))
    assert isinstance(p, Proposal)
    assert p.code is not None and "class ModelNew" in p.code
    assert p.answer == GOOD
    assert (p.prompt_tokens, p.completion_tokens) == (123, 45)
    assert p.meta["attempts"] == 1 and p.meta["finish_reason"] == "stop"
    body = openai_server.requests[0]
    assert body["model"] == "scripted-model" and body["temperature"] == 0.2 and body["max_tokens"] == 777
    assert body["messages"][0]["role"] == "system" and body["messages"][-1]["content"] == "PROMPT-MARKER reference here"
    assert openai_server.headers[0]["authorization"] == "Bearer test-key"
    assert proposer.usage.requests == 1 and proposer.usage.prompt_tokens == 123
    assert proposer.usage.completion_tokens == 45


def test_openai_token_accounting_sums_over_calls(openai_server):
    openai_server.add(Reply.ok(GOOD), Reply.ok("short answer without code"))
    proposer = openai_proposer(openai_server)
    a = proposer.propose(request(prompt="one two three"))
    b = proposer.propose(request(prompt="four five"))
    system_words = len(openai_server.requests[0]["messages"][0]["content"].split())
    assert a.prompt_tokens == system_words + 3 and b.prompt_tokens == system_words + 2
    assert a.completion_tokens == len(GOOD.split()) and b.completion_tokens == 4
    assert proposer.usage.prompt_tokens == a.prompt_tokens + b.prompt_tokens
    assert proposer.usage.completion_tokens == a.completion_tokens + b.completion_tokens


def test_openai_missing_usage_is_zero_and_marked(openai_server):
    openai_server.add(Reply(content=GOOD, include_usage=False))
    p = openai_proposer(openai_server).propose(request())
    assert (p.prompt_tokens, p.completion_tokens) == (0, 0) and p.meta["usage_reported"] is False


def test_openai_retries_429_and_500_then_succeeds(openai_server):
    openai_server.add(Reply.error(429, retry_after_s=0.7), Reply.error(500), Reply.ok(GOOD))
    sleep = RecordingSleep()
    proposer = openai_proposer(openai_server, sleep=sleep, rng=random.Random(0), max_retries=3)
    p = proposer.propose(request())
    assert p.code is not None
    assert len(openai_server.requests) == 3
    assert p.meta["attempts"] == 3 and len(p.meta["errors"]) == 2
    assert "RateLimitError" in p.meta["errors"][0] and "InternalServerError" in p.meta["errors"][1]
    assert len(sleep.calls) == 2
    assert sleep.calls[0] >= 0.7  # the server's Retry-After wins over the 0.01 s backoff
    assert sleep.calls[1] < 0.7  # no Retry-After on the 500: our own short backoff
    assert proposer.usage.retries == 2 and proposer.usage.requests == 1


def test_openai_gives_up_after_policy_is_spent(openai_server):
    openai_server.add(*[Reply.error(503) for _ in range(3)], Reply.ok(GOOD))
    sleep = RecordingSleep()
    proposer = openai_proposer(openai_server, sleep=sleep, max_retries=2)
    with pytest.raises(ProposerUnavailable, match="3 attempts"):
        proposer.propose(request())
    assert len(openai_server.requests) == 3 and len(sleep.calls) == 2


def test_openai_client_error_is_not_retried(openai_server):
    openai_server.add(Reply.error(400), Reply.ok(GOOD))
    sleep = RecordingSleep()
    with pytest.raises(ProposerUnavailable, match="BadRequestError"):
        openai_proposer(openai_server, sleep=sleep).propose(request())
    assert len(openai_server.requests) == 1 and sleep.calls == []


def test_openai_switches_to_max_completion_tokens_when_asked(openai_server):
    message = "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens'."
    openai_server.add(Reply.error(400, message=message), Reply.ok(GOOD), Reply.ok(GOOD))
    sleep = RecordingSleep()
    proposer = openai_proposer(openai_server, sleep=sleep, max_retries=0, max_tokens=99)
    p = proposer.propose(request())
    assert p.code is not None and p.meta["attempts"] == 2 and sleep.calls == []
    first, second = openai_server.requests[:2]
    assert first["max_tokens"] == 99 and "max_completion_tokens" not in first
    assert second["max_completion_tokens"] == 99 and "max_tokens" not in second
    proposer.propose(request())  # remembered: no second 400
    assert openai_server.requests[2]["max_completion_tokens"] == 99 and len(openai_server.requests) == 3


def test_openai_timeout_on_slow_answer_then_retry(openai_server):
    openai_server.add(Reply.slow(GOOD, delay_s=2.0), Reply.ok(GOOD))
    proposer = openai_proposer(openai_server, timeout_s=0.5, max_retries=2)
    p = proposer.propose(request())
    assert p.code is not None
    assert p.meta["attempts"] == 2 and "Timeout" in p.meta["errors"][0]
    assert len(openai_server.requests) == 2


@pytest.mark.parametrize("reply", [
    Reply.ok("I would fuse the two ops, but here is no code."),
    Reply(content=None),
    Reply.ok(""),
    Reply.ok("Analysis first.\n\n```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forw",
             finish_reason="length"),
], ids=["no-block", "null-content", "empty", "truncated"])
def test_openai_malformed_answers_give_code_none(openai_server, reply):
    openai_server.add(reply)
    p = openai_proposer(openai_server).propose(request())
    assert p.code is None
    assert p.answer == (reply.content or "")
    assert p.meta["finish_reason"] == reply.finish_reason


def test_openai_concurrency_limit_is_shared_by_threads(openai_server):
    openai_server.add(*[Reply.slow(GOOD, delay_s=0.3) for _ in range(6)])
    proposer = openai_proposer(openai_server, concurrency=2)
    results: list[Proposal] = []
    lock = threading.Lock()

    def work() -> None:
        p = proposer.propose(request())
        with lock:
            results.append(p)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 6 and all(p.code for p in results)
    assert openai_server.max_in_flight == 2


def test_openai_configured_from_environment(openai_server, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    openai_server.add(Reply.ok(GOOD))
    proposer = make_proposer("openai:scripted-model")
    assert proposer.base_url.startswith(openai_server.base_url)
    assert proposer.propose(request()).code is not None
    assert openai_server.headers[0]["authorization"] == "Bearer env-key"


def test_openai_without_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ProposerError, match="OPENAI_API_KEY"):
        make_proposer("openai:m", base_url="http://127.0.0.1:9/v1")


def test_server_lists_models(openai_server):
    import openai

    client = openai.OpenAI(base_url=openai_server.base_url, api_key="k", max_retries=0)
    assert [m.id for m in client.models.list()] == ["scripted-model"]


def test_default_responder_answers_with_a_runnable_program(openai_server):
    task = make_task()
    prompt = f"Reference:\n\n```python\n{task.source}```\n"
    p = openai_proposer(openai_server).propose(request(task, prompt=prompt))
    mod = _load(p.code)
    tm = task.instantiate("full")
    torch.manual_seed(0)
    ref = tm.Model(*tm.get_init_inputs())
    torch.manual_seed(0)
    new = mod.ModelNew(*tm.get_init_inputs())
    x = tm.get_inputs()
    torch.testing.assert_close(new(*x), ref(*x))


def test_retry_policy_backoff_grows_with_jitter_and_cap():
    policy = RetryPolicy(max_retries=5, initial_s=1.0, max_s=8.0, jitter=0.25)
    rng = random.Random(1)
    for attempt, base in enumerate([1.0, 2.0, 4.0, 8.0, 8.0]):
        d = policy.delay_s(attempt, rng)
        assert base * 0.75 <= d <= min(8.0, base * 1.25)
    assert policy.delay_s(0, rng, retry_after_s=3.0) >= 3.0
    assert policy.delay_s(0, rng, retry_after_s=100.0) == 8.0
    with pytest.raises(ProposerError):
        RetryPolicy(jitter=1.5)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_retryable_classification():
    import openai

    httpx = pytest.importorskip("httpx2") if _has("httpx2") else pytest.importorskip("httpx")

    req = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")

    def status_error(code: int) -> openai.APIStatusError:
        return openai.APIStatusError("x", response=httpx.Response(code, request=req), body=None)

    assert RetryPolicy.retryable(openai.APITimeoutError(request=req))
    assert RetryPolicy.retryable(openai.APIConnectionError(request=req))
    assert all(RetryPolicy.retryable(status_error(c)) for c in (408, 429, 500, 502, 503, 504))
    assert not any(RetryPolicy.retryable(status_error(c)) for c in (400, 401, 403, 404, 422))
    assert not RetryPolicy.retryable(ValueError("x"))


def test_make_proposer_rejects_bad_specs_and_options(tmp_path):
    with pytest.raises(ProposerError, match="unknown proposer"):
        make_proposer("gpt:foo")
    with pytest.raises(ProposerError, match="model name"):
        make_proposer("openai:", api_key="k", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ProposerError, match="does not take"):
        make_proposer("heuristic", temperature=0.1)
    with pytest.raises(ProposerError, match="concurrency"):
        make_proposer("openai:m", api_key="k", base_url="http://127.0.0.1:9/v1", concurrency=0)
    with pytest.raises(ProposerError, match="no such file"):
        make_proposer(f"replay:{tmp_path / 'missing.jsonl'}")
    with pytest.raises(ProposerError, match="strict"):
        make_proposer("heuristic", policy="strict")


# ---------------------------------------------------------------------------------------------
# replay:PATH


def test_replay_jsonl_yields_rows_per_task_in_order(tmp_path):
    path = tmp_path / "gen.jsonl"
    rows = [
        {"task": "toy/linear", "code": "class ModelNew: pass  # first\n"},
        {"task": "other/task", "code": "class ModelNew: pass  # other\n"},
        {"task": "linear", "answer": "why\n```python\nclass ModelNew: pass  # second\n```\n", "prompt_tokens": 9},
        {"task": "toy/linear", "answer": "no code here"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    proposer = make_proposer(f"replay:{path}")
    assert isinstance(proposer, ReplayProposer)
    assert proposer.task_names == ["toy/linear", "other/task", "linear"]
    task = make_task()
    assert proposer.remaining("toy/linear") == 3
    got = [proposer.propose(request(task)) for _ in range(3)]
    assert "# first" in got[0].code and "```python" in got[0].answer
    assert "# second" in got[1].code and got[1].prompt_tokens == 9
    assert got[2].code is None and got[2].answer == "no code here"
    with pytest.raises(Exhausted):
        proposer.propose(request(task))
    assert "# other" in proposer.propose(request(make_task("other/task"))).code


def test_replay_jsonl_bad_rows_are_clear_errors(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task": "a", "code": "x"}\n{not json}\n')
    with pytest.raises(ProposerError, match=r"bad.jsonl:2 is not JSON"):
        make_proposer(f"replay:{path}")
    path.write_text('{"code": "x"}\n')
    with pytest.raises(ProposerError, match="task"):
        make_proposer(f"replay:{path}")


def test_replay_folder_names_tasks_by_header_or_path(tmp_path):
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "matmul.py").write_text("class ModelNew: pass  # a\n")
    (tmp_path / "level1" / "matmul__2.py").write_text("class ModelNew: pass  # b\n")
    (tmp_path / "level1" / "matmul__10.py").write_text("class ModelNew: pass  # c\n")
    (tmp_path / "whatever.py").write_text("# generated\n# task: level1/matmul\nclass ModelNew: pass  # d\n")
    (tmp_path / "conv.py").write_text("class ModelNew: pass  # e\n")
    proposer = make_proposer(f"replay:{tmp_path}")
    task = make_task("level1/matmul")
    codes = []
    while True:
        try:
            codes.append(proposer.propose(request(task)).code)
        except Exhausted:
            break
    assert [c.split("# ")[-1].strip() for c in codes] == ["a", "b", "c", "d"]
    assert "# e" in proposer.propose(request(make_task("level2/conv"))).code


# ---------------------------------------------------------------------------------------------
# heuristic


def _load(source: str) -> types.ModuleType:
    mod = types.ModuleType("candidate")
    exec(compile(source, "<candidate>", "exec"), mod.__dict__)  # noqa: S102 - our own generated program
    return mod


def _check_matches_reference(task: Task, source: str) -> None:
    tm = task.instantiate("full")
    mod = _load(source)
    torch.manual_seed(0)
    ref = tm.Model(*tm.get_init_inputs())
    torch.manual_seed(0)
    new = mod.ModelNew(*tm.get_init_inputs())
    for _ in range(2):
        x = tm.get_inputs()
        out, expected = new(*x), ref(*x)
        assert type(out) is torch.Tensor and out.is_contiguous()
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


def test_embed_reference_renames_model_and_drops_input_factories():
    src = embed_reference(LINEAR)
    assert "class _Reference(nn.Module)" in src and "super(_Reference, self)" in src
    assert "Model" not in src.replace("_Reference", "")
    assert "get_inputs" not in src and "get_init_inputs" not in src
    assert "dim = 32" in src  # module constants stay: a forward may read them


def test_task_traits_see_convolutions_and_training_dependence():
    lin, conv, conv_bn = (task_traits(make_task(n, s)) for n, s in
                          (("a", LINEAR), ("b", CONV), ("c", CONV_BN)))
    assert not lin.conv and not lin.training_dependent and lin.tensor_inputs_only
    assert conv.conv2d and not conv.training_dependent
    assert conv_bn.conv2d and conv_bn.training_dependent


def test_heuristic_variants_are_distinct_complete_programs_then_exhausted():
    task = make_task("toy/conv", CONV)
    proposer = make_proposer("heuristic", device="cpu", policy="open")
    assert isinstance(proposer, HeuristicProposer)
    names, codes = [], set()
    while True:
        try:
            p = proposer.propose(request(task))
        except Exhausted:
            break
        assert p.code is not None and p.code in p.answer and "Performance analysis" in p.answer
        compile(p.code, "<candidate>", "exec")
        assert "class ModelNew(nn.Module)" in p.code and "def __init__(self, *args, **kwargs)" in p.code
        assert heuristic_name(p.code) == p.meta["rewrite"]
        names.append(p.meta["rewrite"])
        codes.add(p.code)
    assert len(names) == len(set(names)) == len(codes) == len(proposer.portfolio(task))
    assert {"inference_mode", "channels_last+inference_mode", "jit_freeze",
            "inference_mode+compile-default"} <= set(names)


def test_heuristic_filters_rewrites_by_task():
    proposer = HeuristicProposer()
    lin = [r.name for r in proposer.portfolio(make_task("a", LINEAR))]
    bn = [r.name for r in proposer.portfolio(make_task("b", CONV_BN))]
    assert not any("channels_last" in n for n in lin) and "jit_freeze" in lin
    # batch norm behaves differently in eval mode: no freezing; but it is a convolution
    assert not any("freez" in n for n in bn) and "channels_last+inference_mode" in bn
    assert not any("cuda_graph" in n or "reduce-overhead" in n for n in lin + bn)


def test_heuristic_stacks_on_a_heuristic_parent():
    task = make_task("toy/conv", CONV)
    proposer = HeuristicProposer()
    parent = render_rewrite(task, Rewrite(channels_last=True, inference_mode=True))
    p = proposer.propose(request(task, parent=parent))
    assert p.meta["stacked_on"] == "channels_last+inference_mode"
    assert {"channels_last", "inference_mode"} < set(p.meta["rewrite"].split("+"))


@pytest.mark.parametrize("source,rewrite", [
    (LINEAR, Rewrite(inference_mode=True)),
    (CONV, Rewrite(channels_last=True, inference_mode=True)),
    (CONV_BN, Rewrite(channels_last=True, inference_mode=True)),
    (LINEAR, Rewrite(jit_freeze=True)),
    (CONV, Rewrite(channels_last=True, jit_freeze=True)),
], ids=["inference_mode", "channels_last", "channels_last-batchnorm", "jit_freeze", "channels_last+jit_freeze"])
def test_heuristic_program_runs_and_matches_reference(source, rewrite):
    task = make_task("toy/x", source)
    _check_matches_reference(task, render_rewrite(task, rewrite))


def test_heuristic_gpu_portfolio_renders_cuda_graph_program():
    task = make_task("toy/linear", LINEAR)
    proposer = make_proposer("heuristic", device="cuda")
    names = [r.name for r in proposer.portfolio(task)]
    assert "cuda_graph" in names and "inference_mode+compile-reduce-overhead" in names
    assert "jit_freeze" not in names
    src = render_rewrite(task, Rewrite(cuda_graph=True))
    compile(src, "<candidate>", "exec")
    assert "torch.cuda.graph(graph)" in src and "_clone(self.static_output)" in src


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_heuristic_gpu_programs_run_on_cuda():
    task = make_task("toy/conv", CONV)
    tm = task.instantiate("full")
    proposer = HeuristicProposer(HeuristicConfig(device="cuda"))
    for rewrite in proposer.portfolio(task):
        if rewrite.compile_mode in ("max-autotune", "max-autotune-no-cudagraphs"):
            continue  # minutes of autotuning; the mode itself is torch's
        mod = _load(render_rewrite(task, rewrite))
        torch.manual_seed(0)
        ref = tm.Model(*tm.get_init_inputs()).cuda()
        torch.manual_seed(0)
        new = mod.ModelNew(*tm.get_init_inputs()).cuda()
        for _ in range(3):
            x = [t.cuda() for t in tm.get_inputs()]
            torch.testing.assert_close(new(*x), ref(*x), rtol=1e-3, atol=1e-3, msg=rewrite.name)


def _builtin_variants(names: tuple[str, ...] | None, compiled: bool):
    from kernelrl import suites

    for task in suites.load_suite("builtin"):
        if names is not None and task.name not in names:
            continue
        for rewrite in HeuristicProposer().portfolio(task):
            if rewrite.compiles == compiled and rewrite.compile_mode != "max-autotune-no-cudagraphs":
                yield task, rewrite


def _check_at_small_size(task: Task, source: str) -> None:
    tm = task.instantiate("small")
    mod = _load(source)
    torch.manual_seed(0)
    ref = tm.Model(*tm.get_init_inputs())
    torch.manual_seed(0)
    new = mod.ModelNew(*tm.get_init_inputs())
    torch.manual_seed(1)
    x = tm.get_inputs()
    torch.testing.assert_close(new(*x), ref(*x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("names", [("level1/softmax", "level2/conv2d_batchnorm_relu", "level3/attention_block")])
def test_heuristic_builtin_tasks_without_compile(names):
    checked = [(t.name, r.name) for t, r in _builtin_variants(names, compiled=False)]
    assert len({n for n, _ in checked}) == 3
    for task, rewrite in _builtin_variants(names, compiled=False):
        _check_at_small_size(task, render_rewrite(task, rewrite))


@pytest.mark.slow
def test_heuristic_every_builtin_task_without_compile():
    for task, rewrite in _builtin_variants(None, compiled=False):
        _check_at_small_size(task, render_rewrite(task, rewrite))


@pytest.mark.slow
def test_heuristic_compiled_variants_on_builtin_tasks():
    for task, rewrite in _builtin_variants(("level1/softmax", "level2/conv2d_batchnorm_relu"), compiled=True):
        _check_at_small_size(task, render_rewrite(task, rewrite))


@pytest.mark.slow
def test_heuristic_every_cpu_variant_runs_and_matches_reference():
    # torch.compile's first call takes ~15-30 s per variant on two cores
    for name, source in (("toy/linear", LINEAR), ("toy/conv", CONV)):
        task = make_task(name, source)
        for rewrite in HeuristicProposer().portfolio(task):
            if rewrite.compile_mode == "max-autotune-no-cudagraphs":
                continue  # benchmarks many kernels: minutes on two cores
            _check_matches_reference(task, render_rewrite(task, rewrite))


# ---------------------------------------------------------------------------------------------
# hf:PATH


@pytest.fixture(scope="module")
def tiny_hf_model(tmp_path_factory):
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-lm")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([LINEAR, CONV, "```python\nclass ModelNew(nn.Module):\n```"], trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>")
    fast.save_pretrained(path)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=fast.vocab_size, n_positions=512, n_embd=32, n_layer=2, n_head=2,
                        eos_token_id=fast.eos_token_id, bos_token_id=fast.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(path)
    return path


def test_hf_proposer_generates_with_a_local_model(tiny_hf_model):
    proposer = make_proposer(f"hf:{tiny_hf_model}", max_new_tokens=12, temperature=0.0)
    p = proposer.propose(request(prompt="class Model: make it faster"))
    assert isinstance(p.answer, str)
    assert p.prompt_tokens > 5 and 1 <= p.completion_tokens <= 12
    assert p.code is None  # random weights write no fenced program
    again = proposer.propose(request(prompt="class Model: make it faster"))
    assert again.answer == p.answer  # greedy decoding is deterministic


def test_hf_proposer_uses_the_chat_template(tiny_hf_model, tmp_path):
    from transformers import AutoTokenizer

    import shutil

    path = tmp_path / "chat"
    shutil.copytree(tiny_hf_model, path)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[reply]"
    tok.save_pretrained(path)
    proposer = make_proposer(f"hf:{path}", max_new_tokens=4, temperature=0.0, system="SYS")
    plain = make_proposer(f"hf:{tiny_hf_model}", max_new_tokens=4, temperature=0.0, system="SYS")
    with_template = proposer.propose(request(prompt="hello"))
    without = plain.propose(request(prompt="hello"))
    # the template adds role tags, so more prompt tokens reach the model
    assert with_template.prompt_tokens > without.prompt_tokens


def test_hf_proposer_missing_folder_is_a_clear_error(tmp_path):
    pytest.importorskip("transformers")
    with pytest.raises(ProposerError, match="no model folder"):
        make_proposer(f"hf:{tmp_path / 'nope'}")


def test_heuristic_skips_rewrites_already_shown_in_the_prompt():
    task = make_task("toy/linear", LINEAR)
    shown = render_rewrite(task, Rewrite(inference_mode=True))
    prompt = f"### Version A: correct, speedup 1.10x\n\n```python\n{shown}```\n"
    p = HeuristicProposer().propose(request(task, prompt=prompt))
    assert p.meta["rewrite"] != "inference_mode"


# ---------------------------------------------------------------------------------------------
# The search loop against the scripted server


def test_search_against_scripted_server_stores_every_answer(openai_server, tmp_path):
    """3 tasks x 2 chains x 4 steps through the real prompt builder and the openai proposer."""
    import io

    from rich.console import Console

    from kernelrl.database import Database
    from kernelrl.result import EvalResult, Status
    from kernelrl.search import SearchConfig, run_search
    from kernelrl.task import load_task

    tasks = [load_task(n) for n in ("level1/softmax", "level1/rmsnorm", "level1/scaled_residual_add")]
    openai_server.add(Reply.error(429, retry_after_s=0), Reply.error(500))  # first calls retried
    answers: list[str] = []
    respond = openai_server.responder

    def recording_responder(body):
        reply = respond(body)
        answers.append(reply.content)
        return reply

    openai_server.responder = recording_responder

    modules = {t.name: t.instantiate("small") for t in tasks}

    def evaluate(task, cand):
        # Run the program once against the reference (it must really be correct), then give a
        # fixed, source-dependent speedup so the chains have something to compare.
        tm = modules[task.name]
        mod = _load(cand.source)
        torch.manual_seed(0)
        ref = tm.Model(*tm.get_init_inputs())
        torch.manual_seed(0)
        new = mod.ModelNew(*tm.get_init_inputs())
        x = tm.get_inputs()
        torch.testing.assert_close(new(*x), ref(*x))
        speed = 0.5 + int(cand.hash[:4], 16) % 300 / 100
        return EvalResult(task=task.name, status=Status.CORRECT, speedup=speed, candidate_hash=cand.hash)

    proposer = openai_proposer(openai_server, concurrency=2)
    cfg = SearchConfig(tasks=tuple(t.name for t in tasks), db_path=tmp_path / "k.db", proposer=proposer.spec,
                       budget=8, chains=2, model_concurrency=2)
    summary = run_search(cfg, console=Console(file=io.StringIO()), tasks=tasks, proposer=proposer, evaluate=evaluate)
    assert summary.errors == ()
    assert [t.candidates for t in summary.tasks] == [8, 8, 8]
    assert len(openai_server.requests) == 24 + 2
    with Database(cfg.db_path) as db:
        cands = db.candidates()
        tokens = db.token_totals()
    assert len(cands) == 24 and all(c.result is not None and c.result.status is Status.CORRECT for c in cands)
    assert sorted(c.answer for c in cands) == sorted(answers)  # every answer stored, as sent
    assert {c.prompt for c in cands} == set(openai_server.prompts())  # and the prompt it answered
    assert tokens == (proposer.usage.prompt_tokens, proposer.usage.completion_tokens)
    for c in cands:
        if c.step == 0:
            continue
        parent = next(p for p in cands if p.id == c.parents[0])
        # every later prompt holds earlier code with its measured speedup, the chain's best marked
        assert f"speedup {parent.speedup:.2f}x" in c.prompt and "current best of this chain" in c.prompt


@pytest.mark.slow
def test_search_against_scripted_server_with_the_real_evaluator(openai_server, tmp_path):
    """The same 3 x 2 x 4 run, every answer judged by the evaluator (minutes on two cores)."""
    import io

    from rich.console import Console

    from kernelrl.database import Database
    from kernelrl.result import Status
    from kernelrl.search import SearchConfig, run_search

    names = ("level1/softmax", "level1/rmsnorm", "level1/scaled_residual_add")
    proposer = openai_proposer(openai_server, concurrency=2)
    cfg = SearchConfig(tasks=names, db_path=tmp_path / "k.db", proposer=proposer.spec, budget=8, chains=2,
                       baselines=False)
    summary = run_search(cfg, console=Console(file=io.StringIO()), proposer=proposer)
    assert summary.errors == () and [t.candidates for t in summary.tasks] == [8, 8, 8]
    with Database(cfg.db_path) as db:
        cands = db.candidates()
    assert len(cands) == 24 and all(c.result is not None for c in cands)
    assert all(c.result.status is Status.CORRECT for c in cands), [c.result.message for c in cands]
    for c in cands:
        if c.step > 0:
            parent = next(p for p in cands if p.id == c.parents[0])
            assert f"speedup {parent.speedup:.2f}x" in c.prompt
