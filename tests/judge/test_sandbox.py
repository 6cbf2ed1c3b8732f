"""The sandbox environment: allow-listed, secrets never copied, allocator pinned."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelrl.judge.sandbox import SandboxConfig, worker_env
from kernelrl.judge.startup import PINNED_ALLOCATOR_ENV
from kernelrl.result import Containment


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


@pytest.mark.parametrize("level", [Containment.NAMESPACES, Containment.FULL])
def test_isolated_worker_sees_no_other_process(tmp_path: Path, level: Containment):
    """With namespaces (root) or bubblewrap, the worker's /proc holds only its sandbox: no judge
    environ to read. Under namespaces it is its namespace's first process; under bubblewrap the
    second (bubblewrap's reaper is the first)."""
    import os
    import time

    from kernelrl.judge.containment import probe
    from kernelrl.judge.sandbox import Worker

    config = SandboxConfig(containment=level)
    if probe(level, config.uids).level is not level:
        pytest.skip(f"{level.value} containment is not available here")
    w = Worker(role="candidate", config=config, device="cpu", root=tmp_path)
    try:
        hello = w.wait_ready(deadline=time.monotonic() + 60)
        # a forked worker is the third: bubblewrap's reaper, the process holding the sandbox, it
        assert hello.pid == (1 if level is Containment.NAMESPACES else 3 if w.forked else 2)
        assert w.pid != w.proc.pid and os.path.exists(f"/proc/{w.pid}/task")
        assert w.thread_count() and w.cpu_time_ns()
    finally:
        w.close()


def test_timing_cores_leave_the_lowest_core_to_the_judge(monkeypatch):
    import os

    from kernelrl.judge.sandbox import timing_cores

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert timing_cores(SandboxConfig()) == frozenset({1, 2, 3})
    assert timing_cores(SandboxConfig(threads=2)) == frozenset({2, 3})
    assert timing_cores(SandboxConfig(threads=8)) == frozenset({1, 2, 3})  # never the judge's core
    assert timing_cores(SandboxConfig(bind_timing=False)) is None
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})
    assert timing_cores(SandboxConfig()) is None


def test_bind_moves_every_thread_of_a_worker_and_back(tmp_path: Path):
    import os
    import time

    from kernelrl.judge.sandbox import Worker

    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        pytest.skip("needs two cores")
    target = frozenset({max(mine)})
    w = Worker(role="candidate", config=SandboxConfig(), device="cpu", root=tmp_path)
    try:
        w.wait_ready(deadline=time.monotonic() + 60)
        tids = [int(t) for t in os.listdir(f"/proc/{w.pid}/task")]
        w.bind(target)
        assert all(os.sched_getaffinity(t) == target for t in tids)
        w.bind(None)
        assert all(os.sched_getaffinity(t) == mine for t in tids)
    finally:
        w.close()


@pytest.mark.parametrize("level", [Containment.NONE, Containment.FULL])
def test_from_the_timing_pool_on_every_stray_is_ended_whatever_its_parentage(tmp_path: Path, level: Containment):
    """A process in the worker's cgroup that is not its interpreter (here one the test started and
    moved in: no parent in the sandbox at all) is ended before the timing pool is sent, and its CPU
    is the worker's."""
    import subprocess
    import time

    from kernelrl.judge import cgroup
    from kernelrl.judge.containment import probe
    from kernelrl.judge.protocol import Kind
    from kernelrl.judge.sandbox import Worker

    config = SandboxConfig(containment=level)
    if not cgroup.available() or probe(level, config.uids).level is not level:
        pytest.skip(f"no cgroups or no {level.value} containment here")
    w = Worker(role="candidate", config=config, device="cpu", root=tmp_path)
    try:
        w.wait_ready(deadline=time.monotonic() + 60)
        assert w.cgroup is not None and w.strays() == []
        before = w.cpu_time_ns() or 0
        burner = subprocess.Popen(w.cgroup.join_argv(["/bin/sh", "-c", "while :; do :; done"]))
        time.sleep(0.3)
        assert w.strays() == [burner.pid] and w.child_count() == 1
        assert (w.cpu_time_ns() or 0) - before > 20_000_000  # a busy machine gives it a share
        w.command(Kind.POOL, [], deadline=time.monotonic() + 30)  # the worker's answer does not matter
        assert burner.wait(timeout=5) == -9 and w.strays() == [] and w.strays_ended == 1
    finally:
        w.close()
    assert not w.cgroup.path.exists()
