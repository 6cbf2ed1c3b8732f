"""Forked workers (`kernelrl.judge.isolation.zygote`): contained as a spawned worker is, told apart only by
their start, and the zygote refuses what it was not built for.

Each test compares a forked worker with a spawned one of the same configuration, read from the
judge's side (/proc), never on the worker's word. They need what forking needs (root, bubblewrap,
a cgroup per worker); elsewhere they skip, and every worker is spawned.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from kernelrl.judge.isolation.cgroup import available as cgroup_available
from kernelrl.judge.isolation.containment import probe
from kernelrl.judge.isolation.sandbox import SandboxConfig, Worker, worker_env
from kernelrl.judge.isolation.zygote import Request, Zygote, ZygoteError
from kernelrl.result import Containment


def _forks_here() -> bool:
    """Whether the judge forks CPU workers on this machine (what `fork_workers` needs)."""
    return (os.geteuid() == 0 and cgroup_available()
            and probe(Containment.FULL, SandboxConfig().uids).level is Containment.FULL)


def _worker(tmp_path: Path, *, fork: bool) -> Worker:
    """A ready worker, forked or spawned; where forking is possible a forked one must be forked
    (a zygote falling back to a spawn is a failure here, not a skip)."""
    if not _forks_here():
        pytest.skip("workers are not forked here (root, full containment and a cgroup per worker)")
    w = Worker(role="candidate", config=SandboxConfig(fork_workers=fork), device="cpu", root=tmp_path)
    w.wait_ready(deadline=time.monotonic() + 60)
    assert w.forked is fork, w.log_tail()
    return w


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def _facts(w: Worker) -> dict[str, object]:
    """What the judge can read of a worker from outside: identity, privileges, descriptors,
    environment, session and terminal, working folder."""
    status = _status(w.pid)
    environ = dict(item.split("=", 1) for item in Path(f"/proc/{w.pid}/environ").read_text().split("\0") if "=" in item)
    return {
        "uids": status["Uid"].split(), "gids": status["Gid"].split(), "groups": status["Groups"],
        "CapEff": status["CapEff"], "CapPrm": status["CapPrm"], "CapBnd": status["CapBnd"],
        "CapAmb": status["CapAmb"], "NoNewPrivs": status["NoNewPrivs"], "Seccomp": status["Seccomp"],
        "fds": len(os.listdir(f"/proc/{w.pid}/fd")), "environ": environ,
        "own_session": os.getsid(w.pid) != os.getsid(0),
        "tty": Path(f"/proc/{w.pid}/stat").read_text().rpartition(")")[2].split()[4],  # tty_nr: none is 0
        "cwd": os.readlink(f"/proc/{w.pid}/cwd"),
    }


def test_a_forked_worker_is_what_a_spawned_one_is(tmp_path: Path):
    """Same uid (the worker's, not root), no capability in any set, no_new_privs, the same seccomp
    mode, as many descriptors, the same environment, a session not the judge's and no terminal,
    its scratch as cwd."""
    spawned, forked = _worker(tmp_path, fork=False), _worker(tmp_path, fork=True)
    try:
        a, b = _facts(spawned), _facts(forked)
        for facts, w in ((a, spawned), (b, forked)):  # each its own uid, real to saved
            assert facts.pop("uids") == facts.pop("gids") == [str(w.uid)] * 4
        assert b == a  # the environment included
        assert b["CapEff"] == b["CapBnd"] == "0000000000000000" and b["NoNewPrivs"] == "1" and b["Seccomp"] == "2"
        assert b["own_session"] is True and b["tty"] == "0"
    finally:
        spawned.close()
        forked.close()


def test_a_forked_worker_shares_its_sandbox_not_the_judges_namespaces(tmp_path: Path):
    """It is in its holder's namespaces (bubblewrap's), none of them the judge's, and sees the
    sandbox's processes only: bubblewrap's reaper, the holder, itself."""
    w = _worker(tmp_path, fork=True)
    try:
        assert w._joined is not None
        holder = w._joined.holder
        for ns in ("mnt", "pid", "net", "ipc", "uts", "cgroup"):
            theirs = os.readlink(f"/proc/{w.pid}/ns/{ns}")
            assert theirs == os.readlink(f"/proc/{holder}/ns/{ns}")
            assert theirs != os.readlink(f"/proc/self/ns/{ns}")
        assert _status(w.pid)["NSpid"].split()[-1] == "3"
        assert w.strays() == []  # neither the holder nor the keeper is taken for a helper
    finally:
        w.close()


def test_a_forked_workers_end_is_seen_with_its_exit_status(tmp_path: Path):
    """Killed from outside, the worker's death reaches the judge as a spawned one's does: the
    answer pipe ends, and its signal comes from its keeper."""
    import signal

    from kernelrl.judge.harness.protocol import Kind
    from kernelrl.judge.isolation.sandbox import WorkerDied

    w = _worker(tmp_path, fork=True)
    try:
        os.kill(w.pid, signal.SIGSEGV)
        with pytest.raises(WorkerDied, match="SIGSEGV"):
            w.command(Kind.GET_STATE, deadline=time.monotonic() + 30)
    finally:
        w.close()
    assert not Path(f"/proc/{w.pid}").exists()


def test_a_bad_request_is_refused_and_the_zygote_goes_on(tmp_path: Path):
    """A request with the wrong descriptors, or one naming no live process, is answered with an
    error, and the same zygote starts the next worker."""
    env = worker_env(SandboxConfig(), tmp_path)
    z = Zygote(env)
    try:
        r, w = os.pipe()
        socket.send_fds(z._sock, [b'{"holder": 1, "uid": 1900000000, "cgroup_procs": null, "arena_capacity": 1}'], [r, w])
        assert "descriptors" in z._sock.recv(4096).decode()
        fds = [*os.pipe(), *os.pipe(), os.open("/dev/null", os.O_RDONLY)]
        with pytest.raises(ZygoteError):
            z.start(Request(holder=2**22 + 7, uid=1_900_000_000, cgroup_procs=None, arena_capacity=1),
                    (fds[0], fds[1], fds[2], fds[3], fds[4]))
        for fd in (r, w, *fds):
            os.close(fd)
        assert z.proc.poll() is None
    finally:
        z.close()
    assert z.proc.poll() is not None


def test_a_dead_zygote_is_started_again(tmp_path: Path, monkeypatch):
    from kernelrl.judge.isolation import zygote

    # A registry of the test's own: the session's zygotes serve other tests' long-lived workers,
    # whose ends their zygote reaps (killed, its orphans wait for the host's init to reap them).
    own: dict = {}
    monkeypatch.setattr(zygote, "_zygotes", own)
    try:
        _worker(tmp_path, fork=True).close()
        dead = list(own.values())
        for z in dead:
            z.proc.kill()
            z.proc.wait()
        w = _worker(tmp_path, fork=True)
        try:
            live = {z for z in own.values() if z.proc.poll() is None}
            assert w.forked and live and not live & set(dead)
        finally:
            w.close()
    finally:
        for z in own.values():
            z.close()


def test_a_zygote_that_cannot_fork_leaves_the_worker_spawned(tmp_path: Path, monkeypatch):
    """Where the zygote cannot start a worker (here: it says so at once), the sandbox made for
    the fork is ended and the worker is spawned, contained as ever, the reason in its log."""
    from kernelrl.judge.isolation import zygote

    def refuse(env: dict[str, str]) -> Zygote:
        raise ZygoteError("the zygote has 2 threads")

    monkeypatch.setattr(zygote, "zygote_for", refuse)
    if not _forks_here():
        pytest.skip("workers are not forked here (root, full containment and a cgroup per worker)")
    w = Worker(role="candidate", config=SandboxConfig(), device="cpu", root=tmp_path)
    try:
        hello = w.wait_ready(deadline=time.monotonic() + 60)
        assert not w.forked and hello.pid == 2 and _status(w.pid)["Seccomp"] == "2"
        assert not w.strays()  # nothing of the sandbox made for the fork is left in its cgroup
        assert "not forked, spawned instead: the zygote has 2 threads" in w.log_tail()
    finally:
        w.close()


_PRELOAD_PROBE = """
import os, sys
import kernelrl.judge.harness.worker
from kernelrl.judge.isolation import zygote
zygote._preload()
threads = len(os.listdir("/proc/self/task"))
before = set(sys.modules)
import torch
model = torch.compile(torch.nn.Linear(4, 4))
late = sorted(m for m in set(sys.modules) - before if m.startswith(("torch._dynamo", "torch._inductor")))
print(threads, len(late), late[:5])
"""


def test_the_zygote_preloads_what_torch_compile_imports_and_stays_single_threaded(tmp_path: Path):
    """After its preload, in a worker's environment: one thread (else it could not fork), and
    `torch.compile` imports none of dynamo's or inductor's modules (else its list is out of date
    for this torch, and every compiling worker pays the import again)."""
    import subprocess
    import sys

    env = worker_env(SandboxConfig(), tmp_path)
    out = subprocess.run([sys.executable, "-c", _PRELOAD_PROBE], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    threads, late, names = out.stdout.strip().split(" ", 2)
    assert threads == "1", out.stdout
    assert late == "0", names
