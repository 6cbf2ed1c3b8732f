"""The retry policy shared by every caller of a model endpoint."""

from __future__ import annotations

import random

import pytest

from kernelrl.endpoint import RetryPolicy


def test_retry_policy_backoff_grows_with_jitter_and_cap():
    policy = RetryPolicy(max_retries=5, initial_s=1.0, max_s=8.0, jitter=0.25)
    rng = random.Random(1)
    for attempt, base in enumerate([1.0, 2.0, 4.0, 8.0, 8.0]):
        d = policy.delay_s(attempt, rng)
        assert base * 0.75 <= d <= min(8.0, base * 1.25)
    assert policy.delay_s(0, rng, retry_after_s=3.0) >= 3.0
    assert policy.delay_s(0, rng, retry_after_s=100.0) == 8.0
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(jitter=1.5)
