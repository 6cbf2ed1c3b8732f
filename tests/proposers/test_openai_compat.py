"""The OpenAI-compatible proposer against a real local HTTP server (scripted answers)."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from kernelrl.endpoint import RetryPolicy
from kernelrl.proposers import (
    Proposal,
    ProposerError,
    ProposerUnavailable,
    make_proposer,
)
from kernelrl.tasks.sizes import instantiate
from openai_server import Reply
from proposer_fixtures import (
    GOOD,
    RecordingSleep,
    load_program,
    make_task,
    openai_proposer,
    request,
)


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
    mod = load_program(p.code)
    tm = instantiate(task, "full")
    torch.manual_seed(0)
    ref = tm.Model(*tm.get_init_inputs())
    torch.manual_seed(0)
    new = mod.ModelNew(*tm.get_init_inputs())
    x = tm.get_inputs()
    torch.testing.assert_close(new(*x), ref(*x))


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
