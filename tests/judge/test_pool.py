"""The warm worker pool: workers that are handed out, and workers that cannot start."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from kernelrl.judge.pool import WorkerPool
from kernelrl.judge.sandbox import SandboxConfig, WorkerDied, worker_env
from kernelrl.result import Containment


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


def test_a_call_that_says_what_it_takes_starts_no_spare_until_it_ends(tmp_path: Path):
    # A spare started during a call holds the device's lock shared while it imports torch, so it
    # would hold back that call's measurement; one nobody takes is only killed at close.
    pool = WorkerPool(config=SandboxConfig(), device="cpu", size=2, root=tmp_path)
    taken = []
    try:
        with pool.expecting(2):
            taken = [pool.take(role, deadline=time.monotonic() + 120) for role in ("reference", "candidate")]
            time.sleep(1.0)  # room for any filler the takes started
            assert pool.started == 2
        end = time.monotonic() + 120
        while pool.started < 4 and time.monotonic() < end:
            time.sleep(0.1)
        assert pool.started == 4  # topped up to its size once the call ended
    finally:
        for w in taken:
            w.kill()
            w.close()
        pool.close()


def test_close_ends_a_worker_that_is_still_starting(monkeypatch, tmp_path: Path):
    # An interpreter that never says hello stands for one still importing torch.
    slow = tmp_path / "slow-python"
    slow.write_text("#!/bin/sh\nexec sleep 600\n")
    slow.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(slow))
    pool = WorkerPool(config=SandboxConfig(containment=Containment.NONE), device="cpu", size=1, root=tmp_path)
    end = time.monotonic() + 30
    while not pool._booting and time.monotonic() < end:
        time.sleep(0.05)
    starting = list(pool._booting)
    assert len(starting) == 1
    pool.close()
    assert starting[0].proc.wait(timeout=10) is not None  # ended, not left to its 120 s start limit
