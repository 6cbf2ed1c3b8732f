"""The reward server's Python client (`kernelrl serve`), under its short name.

    from kernelrl.client import RewardClient
    with RewardClient("http://127.0.0.1:8177", token_file="token.txt") as client:
        results = client.evaluate_batch([(task, candidate_source), ...])

The implementation, and what it guarantees, is `kernelrl.serve.client`.
"""

from __future__ import annotations

from kernelrl.serve.client import ClientConfig, RewardClient, ServeError

__all__ = ["ClientConfig", "RewardClient", "ServeError"]
