"""The warm worker pool: workers that are handed out, and workers that cannot start."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from kernelrl.judge.pool import WorkerPool
from kernelrl.judge.sandbox import SandboxConfig, WorkerDied, worker_env


def test_worker_path_finds_the_package_it_was_started_from(tmp_path: Path):
    # Workers run from a scratch folder: they must import this kernelrl, installed or not.
    path = worker_env(SandboxConfig(), tmp_path)["PYTHONPATH"]
    assert (Path(path) / "kernelrl" / "judge" / "worker.py").is_file()


def test_take_hands_out_a_ready_worker(tmp_path: Path):
    pool = WorkerPool(config=SandboxConfig(), device="cpu", size=1, root=tmp_path)
    try:
        worker = pool.take("candidate", deadline=time.monotonic() + 120)
        try:
            assert worker.hello is not None and worker.role == "candidate"
        finally:
            worker.kill()
            worker.close()
    finally:
        pool.close()


def test_workers_that_cannot_start_raise_instead_of_retrying(monkeypatch, tmp_path: Path):
    # An interpreter that exits at once stands for any environment where no worker can start.
    monkeypatch.setattr(sys, "executable", "/bin/false")
    pool = WorkerPool(config=SandboxConfig(), device="cpu", size=0, root=tmp_path)
    try:
        start = time.monotonic()
        with pytest.raises(WorkerDied, match="exit status 1"):
            pool.take("reference", deadline=time.monotonic() + 60)
        assert time.monotonic() - start < 30
        assert pool.started == 3
    finally:
        pool.close()
