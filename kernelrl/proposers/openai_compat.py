"""Proposals from any OpenAI-compatible chat endpoint, through the official `openai` client.

Configured by OPENAI_BASE_URL / OPENAI_API_KEY or the options `base_url`, `api_key`;
`temperature`, `max_tokens` (`max_tokens_field="max_completion_tokens"` for models that want the
newer name; a 400 asking for it switches once by itself), `concurrency` (requests in flight at
once, shared by every thread using the proposer), `timeout_s`, and the retry policy.

Guarantees: the client's own retries are off, so every attempt, wait and failure is counted
here; timeouts, connection failures, 408/409/429 and 5xx are retried with exponential backoff
and jitter, honouring Retry-After; other 4xx raise `ProposerUnavailable` at once.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kernelrl.endpoint import RetryPolicy, retry_after_s
from kernelrl.proposers.base import (
    Proposal,
    ProposalRequest,
    Proposer,
    ProposerError,
    ProposerUnavailable,
    proposal_from_answer,
)

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion

    from kernelrl.jsontypes import JSONObject


@dataclass(kw_only=True)
class Usage:
    """Totals over a proposer's life, for token budgets and reports."""

    requests: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class OpenAIConfig:
    model: str
    base_url: str | None = None  # None: OPENAI_BASE_URL, else the client's default
    api_key: str | None = None  # None: OPENAI_API_KEY
    temperature: float = 0.7
    max_tokens: int = 8192
    # The request field that carries max_tokens. Newer OpenAI models take only
    # "max_completion_tokens"; a 400 that names it switches to it once, by itself.
    max_tokens_field: str = "max_tokens"
    concurrency: int = 4
    timeout_s: float = 600.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    system: str | None = None  # None: the system.txt template

    def __post_init__(self) -> None:
        if not self.model:
            raise ProposerError("openai proposer needs a model name: openai:MODEL")
        if self.concurrency < 1:
            raise ProposerError(f"concurrency must be >= 1, not {self.concurrency}")
        if self.max_tokens < 1:
            raise ProposerError(f"max_tokens must be >= 1, not {self.max_tokens}")
        if self.max_tokens_field not in ("max_tokens", "max_completion_tokens"):
            raise ProposerError("max_tokens_field must be max_tokens or max_completion_tokens, "
                                f"not {self.max_tokens_field!r}")
        if not 0 <= self.temperature <= 2:
            raise ProposerError(f"temperature must be in [0, 2], not {self.temperature}")
        if self.timeout_s <= 0:
            raise ProposerError(f"timeout_s must be > 0, not {self.timeout_s}")


class OpenAIProposer(Proposer):
    """Chat completions with an explicit retry policy (the client's own retries are off, so
    every attempt, wait and failure is ours to count and test) and a shared concurrency limit."""

    def __init__(self, config: OpenAIConfig, *, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> None:
        import openai

        self.config = config
        self.spec = f"openai:{config.model}"
        api_key = config.api_key or os.environ.get("OPENAI_API_KEY")
        if not api_key:
            raise ProposerError("openai proposer needs an API key: set OPENAI_API_KEY or pass api_key "
                                "(local servers accept any non-empty key)")
        base_url = config.base_url or os.environ.get("OPENAI_BASE_URL") or None
        self._client = openai.OpenAI(api_key=api_key, base_url=base_url, timeout=config.timeout_s, max_retries=0)
        self.base_url = str(self._client.base_url)
        self._slots = threading.BoundedSemaphore(config.concurrency)
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._tokens_field = config.max_tokens_field
        self.usage = Usage()
        if config.system is None:
            from kernelrl.episodes.prompt import system_message

            self._system = system_message()
        else:
            self._system = config.system

    def _messages(self, prompt: str) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": self._system}] if self._system else []
        return messages + [{"role": "user", "content": prompt}]

    def propose(self, request: ProposalRequest) -> Proposal:
        cfg = self.config
        failures: list[str] = []
        started = time.monotonic()
        retries = 0  # failed attempts that the retry policy has paid for
        switched = False
        while True:
            try:
                # The slot is held only while a request is in flight, not while backing off.
                with self._slots:
                    response = self._client.chat.completions.create(  # type: ignore[call-overload]
                        model=cfg.model, messages=self._messages(request.prompt),
                        temperature=cfg.temperature, **{self._tokens_field: cfg.max_tokens})
            except Exception as e:  # noqa: BLE001 - classified below; anything unknown is re-raised
                failures.append(f"{type(e).__name__}: {_one_line(e)}")
                if not switched and self._tokens_field == "max_tokens" and _wants_completion_tokens(e):
                    # Not a failure of the endpoint: it only wants the newer field name.
                    self._tokens_field, switched = "max_completion_tokens", True
                    continue
                if not RetryPolicy.retryable(e):
                    if _is_openai_error(e):
                        raise ProposerUnavailable(f"{self.spec}: {failures[-1]}") from e
                    raise
                if retries >= cfg.retry.max_retries:
                    raise ProposerUnavailable(f"{self.spec}: gave up after {len(failures)} attempts; "
                                              f"last error {failures[-1]}") from e
                delay = cfg.retry.delay_s(retries, self._rng, retry_after_s(e))
                retries += 1
                with self._lock:
                    self.usage.retries += 1
                self._sleep(delay)
                continue
            return self._to_proposal(response, len(failures) + 1, failures, time.monotonic() - started)

    def _to_proposal(self, response: ChatCompletion, requests: int, failures: list[str], elapsed_s: float) -> Proposal:
        choice = response.choices[0] if getattr(response, "choices", None) else None
        content = choice.message.content if choice is not None and choice.message is not None else None
        usage = getattr(response, "usage", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        with self._lock:
            self.usage.requests += 1
            self.usage.prompt_tokens += prompt_tokens
            self.usage.completion_tokens += completion_tokens
        meta: JSONObject = {
            "model": getattr(response, "model", None) or self.config.model,
            "finish_reason": getattr(choice, "finish_reason", None),
            "attempts": requests,
            "errors": [*failures],
            "latency_s": round(elapsed_s, 3),
            "usage_reported": usage is not None,
        }
        return proposal_from_answer(content, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                    meta=meta)

    def close(self) -> None:
        self._client.close()


def _wants_completion_tokens(e: BaseException) -> bool:
    import openai

    return (isinstance(e, openai.BadRequestError)
            and "max_completion_tokens" in str(e) and "max_tokens" in str(e).replace("max_completion_tokens", ""))


def _is_openai_error(e: BaseException) -> bool:
    import openai

    return isinstance(e, openai.OpenAIError)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__
