"""The sandbox environment: allow-listed, secrets never copied, allocator pinned."""

from __future__ import annotations

from pathlib import Path

from kernelrl.judge.sandbox import PINNED_ALLOCATOR_ENV, SandboxConfig, worker_env


def test_secrets_never_reach_the_worker(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("HF_TOKEN", "hf-secret")
    monkeypatch.setenv("KERNELRL_SEED", "1234")
    env = worker_env(SandboxConfig(), tmp_path)
    assert "sk-secret" not in env.values() and "hf-secret" not in env.values() and "1234" not in env.values()
    assert env["HOME"] == str(tmp_path) and env["TMPDIR"] == str(tmp_path)


def test_allocator_is_pinned_and_threads_set(tmp_path: Path):
    env = worker_env(SandboxConfig(threads=3), tmp_path)
    for k, v in PINNED_ALLOCATOR_ENV.items():
        assert env[k] == v
    assert env["OMP_NUM_THREADS"] == "3"
    assert "MALLOC_MMAP_THRESHOLD_" not in worker_env(SandboxConfig(pin_allocator=False), tmp_path)


def test_isolated_worker_sees_no_other_process(tmp_path: Path):
    """With namespaces (root), the worker's /proc holds only itself: no judge environ to read."""
    import os
    import time

    import pytest

    from kernelrl.judge.sandbox import Worker, isolation_available

    if not isolation_available():
        pytest.skip("namespaces need root and unshare")
    w = Worker(role="candidate", config=SandboxConfig(), device="cpu", root=tmp_path)
    try:
        hello = w.wait_ready(deadline=time.monotonic() + 60)
        assert hello.pid == 1  # first process of its own PID namespace
        assert w.pid != w.proc.pid and os.path.exists(f"/proc/{w.pid}/task")
        assert w.thread_count() and w.cpu_time_ns()
    finally:
        w.close()
