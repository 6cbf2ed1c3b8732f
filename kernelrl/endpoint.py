"""OpenAI-compatible endpoints: the retry policy every caller of a model endpoint shares.

Used by the proposers (`kernelrl.proposers.openai_compat`) and the adversarial judge
(`kernelrl.checks.llm_judge`). Guarantees: timeouts, connection failures, 408/409/429 and every
5xx are retryable, other 4xx are not; waits grow exponentially with jitter, are capped, and never
undercut a server's Retry-After (up to the cap).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Statuses worth retrying: request timeout, conflict (some gateways), rate limit, server errors.
RETRY_STATUSES = frozenset({408, 409, 429})


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Exponential backoff with jitter. Attempt n (0-based) waits initial * 2**n, capped at
    max_s, times a uniform factor in [1 - jitter, 1 + jitter]; a server's Retry-After is honoured
    (never waiting less than it asks, never more than max_s)."""

    max_retries: int = 4
    initial_s: float = 1.0
    max_s: float = 60.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, not {self.max_retries}")
        if self.initial_s < 0 or self.max_s < 0 or self.max_s < self.initial_s:
            raise ValueError("backoff times must satisfy 0 <= initial_s <= max_s")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), not {self.jitter}")

    def delay_s(self, attempt: int, rng: random.Random, retry_after_s: float | None = None) -> float:
        base = min(self.max_s, self.initial_s * (2.0 ** attempt))
        delay = base * (1.0 + self.jitter * rng.uniform(-1.0, 1.0))
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, self.max_s))
        return min(delay, self.max_s)

    @staticmethod
    def retryable(error: BaseException) -> bool:
        """Timeouts, connection failures, 408/409/429 and every 5xx are retried; other 4xx are not."""
        import openai

        if isinstance(error, openai.APIConnectionError):  # includes APITimeoutError
            return True
        if isinstance(error, openai.APIStatusError):
            return error.status_code in RETRY_STATUSES or error.status_code >= 500
        return False


def retry_after_s(error: BaseException) -> float | None:
    """Seconds a server asked us to wait (Retry-After or retry-after-ms header), if any."""
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) * scale)
        except ValueError:
            continue  # an HTTP date: fall back to our own backoff
    return None
