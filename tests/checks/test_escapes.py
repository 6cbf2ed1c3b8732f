"""Containment: every escape a fixture under tests/fixtures/containment/ tries is contained, and the
correct kernel judged beside it, in the same batch, gets the verdict it gets alone.

One test per property. Each fixture is judged under the default policy (`open`) when no static
rule refuses it (the C++ one that finds libc's functions by name, the SQLite one), else with the
static rules observing only (policy `observe`), so the run shows what containment holds where the
rules miss. Every check of an escape is made from outside: the file, the database, the
listener, the process table, the disk. The fixtures also answer SiLU + 1 when their escape went
through, so an escaping fixture is never `correct`. The last test judges the loopback fixture
without containment and sees it connect: the fixtures and the listener do detect an escape.

Needs full containment (bubblewrap, namespaces): skipped where the evaluator would fall back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import secrets
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from fixture_spec import FIXTURES, parse_fixture

from judge_fixtures import QUICK_AA_TOLERANCE, quick_timing
from kernelrl.candidate import Candidate
from kernelrl.checks import rules as R
from kernelrl.checks.policy import get_policy
from kernelrl.checks.static import check_source
from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.judge.isolation.containment import probe
from kernelrl.judge.isolation.sandbox import SandboxConfig
from kernelrl.result import Containment, EvalResult, Status
from kernelrl.tasks.task import load_task_file

CONTAINMENT = FIXTURES / "containment"
PLACEHOLDER = 'TARGET = "/nonexistent/kernelrl-escape-target"'
PACKAGE_DIR = Path(__file__).resolve().parents[2] / "kernelrl"
# Small limits, so a fixture reaches them at once.
SANDBOX = SandboxConfig(scratch_mib=32, max_file_mib=32, max_processes=64)

BESIDE = '''
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def forward(self, x):
        return F.silu(x)
# run {tag}
'''

pytestmark = [pytest.mark.skipif(probe(Containment.FULL, SANDBOX.uids).level is not Containment.FULL,
                                 reason="full containment (bubblewrap, namespaces) is not available here"),
              pytest.mark.xdist_group("cpu_judge")]  # see conftest.py


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., tuple[EvalResult, EvalResult]]]:
    """judge(fixture name, target, policy=None) -> (the fixture's result, the result of the correct
    kernel judged beside it); asserts the kernel beside got the verdict it gets alone."""
    cache = tmp_path_factory.mktemp("escape-cache")
    made: dict[tuple[str, Containment], Evaluator] = {}
    alone: dict[tuple[str, Containment], Status] = {}
    task = load_task_file(CONTAINMENT.parent / "tasks" / "elementwise_silu.py")

    def new_evaluator(policy: str, level: Containment) -> Evaluator:
        return Evaluator(EvalConfig(
            cache_dir=cache, policy=policy, timeout_s=60, build_timeout_s=300,
            sandbox=dataclasses.replace(SANDBOX, containment=level),
            timing=dataclasses.replace(quick_timing(), max_timing_s=1.0),
            # no A/A copy: what is checked is containment and the neighbour's verdict, and what
            # helpers that slow the reference win is held to AA_NOISE, not to a group's band
            aa_tolerance=QUICK_AA_TOLERANCE))

    def run(name: str, target: str, *, level: Containment = Containment.FULL,
            own_evaluator: bool = False) -> tuple[EvalResult, EvalResult]:
        """`own_evaluator`: judged by an evaluator made for this call and closed after it (a test
        that changes how workers are made while it runs), not the module's shared one."""
        spec = parse_fixture(CONTAINMENT / name)
        assert PLACEHOLDER in spec.source, f"{name} has no {PLACEHOLDER}"
        source = spec.source.replace(PLACEHOLDER, f"TARGET = {target!r}")
        policy = "open" if not get_policy("open").rejects(check_source(source)) else "observe"
        key = (policy, level)
        with contextlib.ExitStack() as closing:
            if own_evaluator:
                ev = closing.enter_context(new_evaluator(policy, level))
                beside_alone = ev.evaluate(task, BESIDE.format(tag=secrets.token_hex(8))).status
            else:
                if key not in made:
                    made[key] = new_evaluator(policy, level)
                ev = made[key]
                if key not in alone:
                    alone[key] = ev.evaluate(task, BESIDE.format(tag=secrets.token_hex(8))).status
                beside_alone = alone[key]
            escape, beside = ev.evaluate_batch([(task, Candidate(source=source, origin=name)),
                                                (task, BESIDE.format(tag=secrets.token_hex(8)))])
        assert escape.containment is level and beside.containment is level
        assert beside.status is beside_alone, (
            f"the kernel beside {name} got {beside.status.value} ({beside.message}), alone "
            f"{beside_alone.value}")
        return escape, beside

    run.cache = cache  # type: ignore[attr-defined]  # the tests that look at the judge's disk
    yield run
    for ev in made.values():
        ev.close()


def _comm_count(title: str) -> int:
    """Processes on this machine whose title (/proc/PID/comm) is `title`."""
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    n += f.read().strip() == title
            except OSError:
                continue
    return n


@contextmanager
def sampling(measure: Callable[[], float], every_s: float = 0.05) -> Iterator[list[float]]:
    """Samples of `measure()` taken in a thread while the block runs."""
    samples: list[float] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            samples.append(measure())
            stop.wait(every_s)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield samples
    finally:
        stop.set()
        t.join()


def test_torch_package_folder_is_read_only(judge):
    name = f"kernelrl-escape-{secrets.token_hex(6)}.txt"
    planted = Path(torch.__path__[0]) / name
    try:
        escape, _ = judge("write_torch_package.py", name)
        assert not planted.exists()
        assert escape.status is Status.CORRECT, escape.message
    finally:
        planted.unlink(missing_ok=True)


@pytest.mark.slow
def test_torch_package_folder_is_read_only_to_native_code_no_rule_sees(judge):
    name = f"kernelrl-escape-{secrets.token_hex(6)}.txt"
    planted = Path(torch.__path__[0]) / name
    source = (CONTAINMENT / "write_torch_package_native.py").read_text().replace(PLACEHOLDER, f"TARGET = {name!r}")
    assert not get_policy("open").rejects(check_source(source))  # judged under the default policy
    try:
        escape, _ = judge("write_torch_package_native.py", name)
        assert not planted.exists()
        assert escape.status is Status.CORRECT, escape.message
    finally:
        planted.unlink(missing_ok=True)


def test_kernelrl_package_is_read_only(judge):
    planted = PACKAGE_DIR / f"escape-{secrets.token_hex(6)}.txt"
    try:
        escape, _ = judge("write_kernelrl_package.py", str(planted))
        assert not planted.exists()
        assert escape.status is Status.CORRECT, escape.message
    finally:
        planted.unlink(missing_ok=True)


def test_build_cache_is_not_visible(judge, tmp_path: Path):
    cache = tmp_path / "cache"
    (cache / "extensions").mkdir(parents=True)
    (cache / "sealed").mkdir()
    escape, _ = judge("write_build_cache.py", str(cache))
    assert not [p for p in cache.rglob("*") if "planted" in p.name]
    assert escape.status is Status.CORRECT, escape.message


def test_database_in_the_cache_folder_is_not_visible(judge, tmp_path: Path):
    path = tmp_path / "cache" / "jobs.db"
    path.parent.mkdir()
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE jobs (id TEXT, status TEXT)")
        db.execute("INSERT INTO jobs VALUES ('a', 'done')")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    escape, _ = judge("write_database.py", str(path))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert escape.status is Status.CORRECT, escape.message


def test_token_file_is_not_readable(judge, tmp_path: Path):
    token = secrets.token_urlsafe(32)
    path = tmp_path / "token.txt"
    path.write_text(token)
    path.chmod(0o600)
    escape, beside = judge("read_token.py", str(path))
    assert escape.status is Status.CORRECT, escape.message  # SiLU + 1 had it read a byte
    assert token not in str(escape.to_dict()) + str(beside.to_dict())


def test_loopback_listener_is_unreachable(judge):
    with _listener() as (port, connections):
        escape, _ = judge("connect_loopback.py", str(port))
    assert connections == []
    assert escape.status is Status.CORRECT, escape.message


def test_fork_bomb_stays_within_the_process_limit_and_ends_with_its_worker(judge):
    title = f"kb{secrets.token_hex(6)}"
    with sampling(lambda: _comm_count(title)) as counts:
        escape, _ = judge("fork_bomb.py", title)
    assert max(counts) > 1, "the bomb never went off"
    assert max(counts) <= SANDBOX.process_limit
    assert _comm_count(title) == 0, f"{escape.status.value}: bomb processes left after the batch"


def test_filling_the_disk_stops_at_the_limits(judge, tmp_path: Path):
    attempt = 256 << 20  # per place; the limits are 32 MiB

    def free() -> float:
        return float(min(os.statvfs(p).f_bavail * os.statvfs(p).f_frsize for p in ("/", "/tmp", str(tmp_path))))

    with sampling(free) as samples:
        escape, _ = judge("fill_disk.py", str(attempt))
    assert samples[0] - min(samples) < attempt, "the judge's disks lost as much as one place was asked to take"
    assert escape.status is Status.CORRECT, escape.message  # SiLU + 1 had any place taken it all


def test_no_child_outlives_its_worker(judge):
    title = f"kc{secrets.token_hex(6)}"
    with sampling(lambda: _comm_count(title)) as counts:
        escape, _ = judge("child_left_running.py", title)
    assert max(counts) >= 1, "the fixture never left a process"
    assert _comm_count(title) == 0, f"{escape.status.value}: its process outlived the worker"


# A copy of the reference measures 1.00 against it (A/A); on this noisy 2-core machine the
# kernel beside a fixture has measured up to ~1.15. A helper-burning fixture was paid 1.9x-16x.
AA_NOISE = 1.25


def _burners_not_paid(judge, name: str, *, own_evaluator: bool = False) -> EvalResult:
    title = f"kh{secrets.token_hex(6)}"
    with sampling(lambda: _comm_count(title)) as counts:
        escape, beside = judge(name, title, own_evaluator=own_evaluator)
    assert max(counts) >= 1, "the helpers never started"
    assert _comm_count(title) == 0, f"{escape.status.value}: helpers outlived the worker"
    paid = escape.status is Status.CORRECT and (escape.speedup or 0.0) > AA_NOISE
    assert not paid, f"paid {escape.speedup:.2f}x for slowing the reference (beside: {beside.speedup})"
    assert escape.status in (Status.CORRECT, Status.FLAGGED), escape.message
    return escape


def test_cpu_burning_helpers_are_not_paid(judge):
    """Helpers started at import, orphaned into a session of their own, burn CPU whenever the
    candidate is not inside a call: they end before the group is timed, whoever adopted them."""
    _burners_not_paid(judge, "burn_cpu_helpers.py")


def test_cpu_burning_helpers_are_not_paid_where_workers_get_no_cgroup(judge, monkeypatch):
    """Where the judge cannot give each worker a cgroup (no writable cgroup v2; whether the lent
    GPU machines, which spawned their CPU workers, are such is what `gpu_env.py`'s cgroups line
    says), a worker's processes are the census of its sandbox's tree (orphans go to its PID
    namespace's first process): the helpers are found and ended there too."""
    from kernelrl.judge.isolation.cgroup import Cgroup

    asked = []
    monkeypatch.setattr(Cgroup, "make", classmethod(lambda cls: asked.append(1)))  # None: no cgroup
    escape = _burners_not_paid(judge, "burn_cpu_helpers.py", own_evaluator=True)
    assert asked, "no worker was made while cgroups were off"
    # found by the census: their CPU between calls is the worker's (with the census broken they
    # went unseen, judged correct)
    assert any(f.rule == R.SIDE_WORK_AFTER_RETURN for f in escape.findings), escape.message


@pytest.mark.slow
def test_cpu_burning_helpers_from_native_code_are_not_paid(judge):
    source = (CONTAINMENT / "burn_cpu_helpers_cpp.py").read_text()
    assert not get_policy("open").rejects(check_source(source))  # judged under the default policy
    _burners_not_paid(judge, "burn_cpu_helpers_cpp.py")


def test_no_user_namespace_or_mount_can_be_made(judge):
    escape, _ = judge("nested_namespace.py", "")
    assert escape.status is Status.CORRECT, escape.message  # SiLU + 1 had any of them gone through


def test_without_containment_the_namespace_fixture_does_make_one(judge):
    """The fixture detects the escape: the judge is root here, and without containment its worker is too."""
    if os.geteuid() != 0:
        pytest.skip("an ordinary user may be refused user namespaces by the system")
    escape, _ = judge("nested_namespace.py", "", level=Containment.NONE)
    assert escape.status is Status.INCORRECT


def _meminfo(field: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) << 10
    raise KeyError(field)


def _own_peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) << 10
    raise KeyError("VmHWM")


def test_the_arena_pins_no_more_than_its_task_needs(judge):
    """posix_fallocate on the inherited arena: before it was sized per task, 16 GiB of shared
    memory were held (measured); now the arena is a few MiB and sealed."""
    base = _meminfo("Shmem")
    with sampling(lambda: float(_meminfo("Shmem") - base)) as grown:
        escape, _ = judge("grow_arena.py", "")
    assert max(grown) < 1 << 30, f"shared memory grew by {max(grown) / (1 << 30):.2f} GiB"
    assert escape.status is Status.CORRECT, escape.message  # SiLU + 1 had it held 1 GiB


def test_a_forged_payload_size_is_refused_before_the_judge_allocates_it(judge):
    """A 3 GiB claim over two tensors naming one range: the judge's peak memory grew 9 GiB (measured)."""
    before = _own_peak_rss()
    escape, _ = judge("forge_payload_size.py", "")
    assert _own_peak_rss() - before < 1 << 30
    assert escape.status is Status.FLAGGED and "result_channel_forged" in escape.message, escape.message


def test_a_sparse_file_in_the_build_folder_costs_the_judge_no_disk(judge):
    """Before sealed builds were capped by apparent size, 1,048,576,000 bytes were kept per source."""
    def cache_bytes() -> float:
        return float(sum(p.stat().st_size for p in judge.cache.rglob("*") if p.is_file()))

    def free() -> float:
        return float(os.statvfs(judge.cache).f_bavail * os.statvfs(judge.cache).f_frsize)

    start = free()
    with sampling(free) as samples:
        escape, _ = judge("sparse_build_file.py", "")
    assert start - min(samples) < 256 << 20, "the judge's disk lost as much as the sparse file claims"
    assert cache_bytes() < 256 << 20
    assert escape.status is Status.CORRECT, escape.message


def test_a_verdict_carries_nothing_of_the_host(judge):
    """The fixture raises what it read of the machine as its error: every fact is taken out of the
    verdict, and what replaced them is there (the error did reach it)."""
    with open("/etc/passwd") as f:
        passwd_line = f.readline().strip()
    interfaces = [n for n in os.listdir("/sys/class/net") if n != "lo"]
    escape, _ = judge("leak_host_facts.py", "")
    assert escape.status is Status.COMPILE_ERROR, escape.message
    shown = str(escape.to_dict())
    assert "<a line of a system account file>" in shown and "<PATH>" in shown
    for fact in [passwd_line, os.environ["PATH"], str(PACKAGE_DIR.parent), *interfaces]:
        assert fact not in shown, f"the verdict shows {fact!r}"


def test_replaced_harness_handlers_that_defer_work_to_spot_checks_are_caught(judge):
    """Timed calls do nothing and each output is computed when a spot check asks for it (paid
    2.00x before timed calls committed to their outputs as they returned)."""
    escape, _ = judge("defer_to_spot_check.py", "")
    assert escape.status is Status.FLAGGED and "output_deferred" in escape.message, escape.message


def test_without_containment_the_loopback_fixture_does_connect(judge):
    """The fixtures and the listener detect an escape: with no containment the fixture connects."""
    with _listener() as (port, connections):
        escape, _ = judge("connect_loopback.py", str(port), level=Containment.NONE)
    assert connections
    assert escape.status is Status.INCORRECT


@contextmanager
def _listener() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP listener on 127.0.0.1 that records what every connection sends."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    got: list[bytes] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    got.append(conn.recv(100))
                except OSError:
                    got.append(b"")

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield server.getsockname()[1], got
        time.sleep(0.3)  # a connection made at the very end is still counted
    finally:
        stop.set()
        t.join()
        server.close()
