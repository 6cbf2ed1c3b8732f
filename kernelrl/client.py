"""The reward server's Python client (`kernelrl serve`), under its short name.

    from kernelrl.client import RewardClient
    with RewardClient("http://127.0.0.1:8177", token_file="token.txt") as client:
        results = client.evaluate_batch([(task, candidate_source), ...])

Every call ends (an hour by default: `ClientConfig.timeout_s`); a token file others may read,
or a token under 32 characters, is refused (`TokenFileError`). The implementation, and what it
guarantees, is `kernelrl.serve.client`.
"""

from __future__ import annotations

from kernelrl.serve.client import ClientConfig, RewardClient, ServeError
from kernelrl.serve.tokens import TokenFileError

__all__ = ["ClientConfig", "RewardClient", "ServeError", "TokenFileError"]
