"""Fixtures for the reward server tests: servers on 127.0.0.1 in threads, and a token file.

Helpers shared by the test modules (candidates, the fake backend, a fast client) live in
`serve_helpers.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from serve_helpers import write_token_file


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    return write_token_file(tmp_path / "token.txt")


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """`start_server(impl, **ServeConfig settings)`: a server in a thread, on a free loopback port,
    with its database in tmp_path, evaluating with the backend object `impl` (None: the one the
    settings name); every server started is stopped at the end."""
    from kernelrl.serve.config import ServeConfig
    from kernelrl.serve.server import RewardServer

    servers = []

    def start(impl: Any = None, **settings: Any) -> RewardServer:
        settings.setdefault("db_path", tmp_path / "serve.db")
        server = RewardServer(ServeConfig(port=0, **settings), backend=impl).start_in_thread()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[Any]:
    """One server for the session with the real evaluator (one CPU lane, quick timing) and a
    token; tests that share it share its evaluator's result cache."""
    from kernelrl.judge.evaluator import EvalConfig
    from kernelrl.judge.timing.timer import TimingConfig
    from kernelrl.serve.config import ServeConfig
    from kernelrl.serve.server import RewardServer

    root = tmp_path_factory.mktemp("real-server")
    write_token_file(root / "token.txt")
    timing = TimingConfig(min_rounds=5, max_rounds=40, max_timing_s=2.0, warmup_calls=2, min_spot_checks=2)
    config = ServeConfig(port=0, db_path=root / "serve.db", token_file=root / "token.txt",
                         eval=EvalConfig(cache_dir=cache_dir, timeout_s=120, timing=timing))
    server = RewardServer(config).start_in_thread()
    yield server
    server.stop()
