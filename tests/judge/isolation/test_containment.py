"""Containment: the bubblewrap command line, the fallback and what it says, the worker's uid and
limits, and the judge's checks on the builds it copies out of and into a worker's scratch."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import kernelrl
from kernelrl.judge.harness import procfs
from kernelrl.judge.harness.places import BUILD_SUBDIR
from kernelrl.judge.isolation import containment
from kernelrl.judge.isolation.builds import MANIFEST, seal, unseal, verified
from kernelrl.judge.isolation.containment import bwrap_prefix, probe, readonly_paths
from kernelrl.judge.isolation.pool import WorkerPool
from kernelrl.judge.isolation.sandbox import SandboxConfig, Worker
from kernelrl.result import Containment, EvalResult, Status

FULL_HERE = probe(Containment.FULL, SandboxConfig().uids).level is Containment.FULL
needs_full = pytest.mark.skipif(not FULL_HERE, reason="full containment (bubblewrap) is not available here")


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_result_records_containment_and_round_trips():
    res = EvalResult(task="t", status=Status.CORRECT, speedup=1.0, containment=Containment.FULL)
    assert EvalResult.from_dict(json.loads(json.dumps(res.to_dict()))).containment is Containment.FULL
    assert EvalResult.from_dict({"task": "t", "status": "correct"}).containment is Containment.NONE  # never claimed


def test_readonly_view_is_the_system_python_and_package_only():
    paths = readonly_paths()
    package = str(Path(kernelrl.__file__).resolve().parent)
    assert package in paths
    assert str(Path(package).parent) not in paths  # the checkout (run folders, token files) stays hidden
    home = os.path.realpath(os.path.expanduser("~"))
    assert not any(home == p or home.startswith(p.rstrip("/") + "/") for p in paths)
    assert not any(p.startswith(os.path.join(home, ".cache")) for p in paths)
    assert "/" not in paths and "/tmp" not in paths


def test_a_python_environment_in_the_home_folder_itself_is_refused(monkeypatch):
    monkeypatch.setattr(containment, "python_paths", lambda: [os.path.expanduser("~")])
    with pytest.raises(ValueError, match="home folder"):
        readonly_paths()


def test_command_line_as_root_drops_to_the_worker_uid_with_no_network():
    argv = bwrap_prefix(bwrap="bwrap", uid=1_900_000_123, device="cpu", scratch_bytes=64 << 20, as_root=True)
    for flag in ("--unshare-net", "--unshare-pid", "--die-with-parent", "--new-session"):
        assert flag in argv
    assert "--unshare-user" not in argv  # root's user namespace would map the worker to root outside
    assert argv[-8:] == ["setpriv", "--reuid=1900000123", "--regid=1900000123", "--clear-groups",
                         "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    assert _pairs(argv, "--tmpfs") == ["/tmp", "/dev/shm"]
    assert _pairs(argv, "--size") == [str(64 << 20)] * 2
    assert not _pairs(argv, "--bind") and not _pairs(argv, "--dev-bind")  # nothing writable from outside
    user = bwrap_prefix(bwrap="bwrap", uid=1000, device="cpu", scratch_bytes=64 << 20, as_root=False)
    assert "--unshare-user" in user and "--disable-userns" in user and "setpriv" not in user


def test_gpu_device_nodes_pass_through_on_cuda_only(monkeypatch, tmp_path: Path):
    nodes = ["nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "null"]
    real_listdir, real_exists = os.listdir, os.path.exists
    monkeypatch.setattr(os, "listdir", lambda p=".": nodes if p == "/dev" else real_listdir(p))
    monkeypatch.setattr(os.path, "exists", lambda p: p.startswith("/dev/nvidia") or real_exists(p))
    cuda = bwrap_prefix(bwrap="bwrap", uid=1_900_000_000, device="cuda", scratch_bytes=1 << 26, as_root=True)
    assert _pairs(cuda, "--dev-bind") == ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl"]
    cpu = bwrap_prefix(bwrap="bwrap", uid=1_900_000_000, device="cpu", scratch_bytes=1 << 26, as_root=True)
    assert not _pairs(cpu, "--dev-bind")


def test_without_bwrap_the_pool_falls_back_and_says_why(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap, no unshare: nothing to contain with
    containment.namespaces_available.cache_clear()
    try:
        pool = WorkerPool(config=SandboxConfig(), device="cpu", size=0)
        try:
            assert pool.containment is Containment.NONE
            pool.warn_if_uncontained()
            line = capsys.readouterr().err.strip()
            assert "not fully contained" in line and "bwrap" in line and "apt-get install bubblewrap" in line
        finally:
            pool.close()
    finally:
        containment.namespaces_available.cache_clear()


def test_a_bwrap_that_cannot_make_namespaces_falls_back_and_says_why(monkeypatch, tmp_path: Path):
    fake = tmp_path / "bin" / "bwrap"  # what bwrap says in a container without the privilege
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    got = probe(Containment.FULL, SandboxConfig().uids)
    assert got.level is (Containment.NAMESPACES if containment.namespaces_available() else Containment.NONE)
    assert "Creating new namespace failed" in got.reason


def test_asking_for_less_is_said_too():
    assert probe(Containment.NONE, SandboxConfig().uids) == containment.Probe(
        Containment.NONE, "containment none was asked for")


@needs_full
def test_full_worker_has_its_own_uid_limits_and_no_capabilities(tmp_path: Path):
    config = SandboxConfig(max_processes=100, max_open_files=512, max_file_mib=8)
    workers = [Worker(config=config, device="cpu", root=tmp_path) for _ in range(2)]
    try:
        for w in workers:
            w.wait_ready(deadline=time.monotonic() + 120)
            status = Path(f"/proc/{w.pid}/status").read_text()
            uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
            assert uid != 0 and uid == (w.uid if os.geteuid() == 0 else os.getuid())
            assert "CapEff:\t0000000000000000" in status and "NoNewPrivs:\t1" in status
            limits = Path(f"/proc/{w.pid}/limits").read_text()
            assert "Max processes             100" in limits and "Max open files            512" in limits
            assert f"Max file size             {8 << 20}" in limits
        if os.geteuid() == 0:
            assert workers[0].uid != workers[1].uid  # process limits are counted per worker
    finally:
        for w in workers:
            w.close()


@needs_full
def test_extra_inherited_descriptors_reach_the_worker(tmp_path: Path):
    r, w_fd = os.pipe()
    worker = Worker(config=SandboxConfig(), device="cpu", root=tmp_path, inherit_fds=(r,))
    try:
        worker.wait_ready(deadline=time.monotonic() + 120)
        assert os.readlink(f"/proc/{worker.pid}/fd/{r}") == os.readlink(f"/proc/self/fd/{r}")
    finally:
        worker.close()
        os.close(r)
        os.close(w_fd)


@needs_full
def test_kill_ends_every_process_of_the_sandbox(tmp_path: Path):
    w = Worker(config=SandboxConfig(), device="cpu", root=tmp_path)
    w.wait_ready(deadline=time.monotonic() + 120)
    sandbox = [w.proc.pid, *procfs.descendants(w.proc.pid)]
    assert len(sandbox) >= 3  # bwrap, its reaper, the interpreter
    w.close()
    assert not [p for p in sandbox if _running(p)]


def _running(pid: int) -> bool:
    """Alive and not a zombie (an ended process whose parent has not collected it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def worker_scratch(tmp_path: Path):
    if not FULL_HERE:
        pytest.skip("full containment (bubblewrap) is not available here")
    w = Worker(config=SandboxConfig(), device="cpu", root=tmp_path)
    w.wait_ready(deadline=time.monotonic() + 120)
    scratch = w.scratch()
    assert scratch is not None
    yield w, scratch
    scratch.close()
    w.close()


def _ext_folder(w: Worker, scratch) -> tuple[int, Path]:
    fd = scratch.folder(f"{BUILD_SUBDIR}/myext", create=True)
    assert fd is not None
    return fd, Path(f"/proc/{w.pid}/root/tmp/{BUILD_SUBDIR}/myext")


def test_seal_keeps_a_build_and_unseal_gives_it_back(worker_scratch, tmp_path: Path):
    w, scratch = worker_scratch
    fd, _ = _ext_folder(w, scratch)
    scratch.write(fd, "myext.so", b"\x7fELF library", 1_000_000_000_000)
    scratch.write(fd, "build.ninja", b"rule cxx", 1_000_000_000_000)
    scratch.write(fd, "lock", b"", 1_000_000_000_000)  # torch's lock: not part of a build
    os.close(fd)
    sealed = tmp_path / "sealed" / "key"
    assert seal(scratch, sealed)
    assert sorted(p.name for p in (sealed / "myext").iterdir()) == ["build.ninja", "myext.so"]
    assert verified(sealed)
    other = Worker(config=SandboxConfig(), device="cpu", root=tmp_path)
    try:
        other.wait_ready(deadline=time.monotonic() + 120)
        with other.scratch() as into:
            assert unseal(sealed, into)
        copied = Path(f"/proc/{other.pid}/root/tmp/{BUILD_SUBDIR}/myext/myext.so")
        assert copied.read_bytes() == b"\x7fELF library" and copied.stat().st_mtime_ns == 1_000_000_000_000
        assert copied.stat().st_uid == other.uid if os.geteuid() == 0 else True
    finally:
        other.close()


def test_a_tampered_sealed_build_is_not_loaded(worker_scratch, tmp_path: Path):
    w, scratch = worker_scratch
    fd, _ = _ext_folder(w, scratch)
    scratch.write(fd, "myext.so", b"\x7fELF library", 1)
    os.close(fd)
    sealed = tmp_path / "sealed" / "key"
    assert seal(scratch, sealed)
    (sealed / "myext" / "myext.so").write_bytes(b"\x7fELF other!")  # same size, other bytes
    assert verified(sealed) is None
    (sealed / "myext" / "myext.so").write_bytes(b"\x7fELF library")
    (sealed / "myext" / "extra.so").write_bytes(b"")  # a file the manifest does not list
    assert verified(sealed) is None
    (sealed / "myext" / "extra.so").unlink()
    assert verified(sealed)
    manifest = json.loads((sealed / MANIFEST).read_text())
    manifest["files"]["../../x/y.so"] = manifest["files"].pop("myext/myext.so")
    (sealed / MANIFEST).write_text(json.dumps(manifest))
    assert verified(sealed) is None


def test_seal_refuses_links_and_files_the_worker_does_not_own(worker_scratch, tmp_path: Path):
    w, scratch = worker_scratch
    fd, inside = _ext_folder(w, scratch)
    os.symlink("/etc/hostname", "myext.so", dir_fd=fd)  # a link to a file of the judge's machine
    os.close(fd)
    assert not seal(scratch, tmp_path / "sealed" / "a")
    os.unlink(inside / "myext.so")
    fd = scratch.folder(f"{BUILD_SUBDIR}/myext")
    (inside / "myext.so").write_bytes(b"root's")  # written by the judge's user, not the worker
    if os.geteuid() == 0:
        assert not seal(scratch, tmp_path / "sealed" / "b")
    os.close(fd)


def test_a_folder_under_the_scratch_is_bound_after_the_scratch_is_mounted(tmp_path):
    # A checkout in /tmp: bound before the scratch tmpfs, the tmpfs would hide it from the worker.
    shown = tmp_path / "checkout"
    shown.mkdir()
    argv = bwrap_prefix(bwrap="bwrap", uid=60001, device="cpu", scratch_bytes=1 << 20, as_root=True,
                        extra=(str(shown),))
    scratch = next(i for i in range(len(argv) - 1) if argv[i] == "--tmpfs" and argv[i + 1] == "/tmp")
    bound = next(i for i in range(len(argv) - 2) if argv[i] == "--ro-bind" and argv[i + 1] == str(shown))
    assert str(shown).startswith("/tmp/") and bound > scratch


def test_the_probe_refuses_a_sandbox_where_a_user_namespace_can_be_made():
    """The probe's own check fails without the seccomp filter (as root, bwrap makes no user namespace
    and leaves unshare to the worker) and passes with it."""
    import shutil
    import subprocess
    import sys

    from kernelrl.judge.harness.device import Device
    from kernelrl.judge.isolation import containment as C
    from kernelrl.judge.isolation.seccomp import program_fd

    bwrap = shutil.which("bwrap")
    if bwrap is None or probe(Containment.FULL, (1_900_000_000, 1_900_001_000)).level is not Containment.FULL:
        pytest.skip("full containment is not available here")

    def run(fd: int | None) -> int:
        argv = C.bwrap_prefix(bwrap=bwrap, uid=1_900_000_007, device=Device.CPU, scratch_bytes=16 << 20,
                              as_root=os.geteuid() == 0, seccomp_fd=fd)
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(Path(kernelrl.__file__).resolve().parents[1])}
        return subprocess.run([*argv, sys.executable, "-S", "-c", C._PROBE], env=env, timeout=60,
                              pass_fds=(fd,) if fd is not None else (), capture_output=True).returncode

    fd = program_fd()
    assert fd is not None
    try:
        assert run(fd) == 0
    finally:
        os.close(fd)
    with open("/proc/sys/user/max_user_namespaces") as f:
        userns_allowed = int(f.read()) > 0
    if os.geteuid() == 0 and userns_allowed:  # an ordinary user's bwrap adds --disable-userns of its own
        assert run(None) == C._PROBE_NAMESPACE_MADE


# -- the probe on a GPU starts CUDA inside the sandbox ------------------------------------------


def test_the_probe_starts_cuda_only_where_a_gpu_is_used():
    from kernelrl.judge.harness.device import Device

    cpu, cuda = containment.probe_script(Device.CPU), containment.probe_script(Device.CUDA)
    assert "cuda" not in " ".join(cpu) and cpu[0] == "-S"  # no torch import, no site-packages
    assert "torch.zeros(1, device='cuda')" in cuda[-1] and cuda[-1].startswith(containment._PROBE)


@pytest.mark.parametrize(("code", "device", "says"), [
    (0, "cuda", ""),
    (containment._PROBE_NO_CUDA, "cuda", "could not start CUDA (RuntimeError: no CUDA-capable device is detected)"),
    (containment._PROBE_NAMESPACE_MADE, "cuda", "could make a user namespace"),
    (containment._PROBE_NO_CUDA, "cpu", "bwrap failed here: RuntimeError"),  # no CUDA step on a CPU: not its message
    (1, "cpu", "bwrap failed here: RuntimeError: no CUDA-capable device is detected"),
], ids=["ok", "no_cuda", "namespace", "cpu_98", "other"])
def test_what_a_failed_probe_says(code, device, says):
    from kernelrl.judge.harness.device import Device

    got = containment.probe_failure(code, "Traceback ...\nRuntimeError: no CUDA-capable device is detected\n",
                                    Device(device))
    assert (says in got) if says else got == ""


@pytest.mark.skipif(not FULL_HERE, reason="full containment (bubblewrap) is not available here")
def test_a_sandbox_where_cuda_cannot_start_is_not_full_and_says_why():
    import torch

    from kernelrl.judge.harness.device import Device

    if torch.cuda.is_available():
        pytest.skip("CUDA starts here: the GPU form is test_a_gpu_sandbox_starts_cuda")
    got = probe(Containment.FULL, SandboxConfig().uids, Device.CUDA)
    assert got.level is not Containment.FULL
    assert "could not start CUDA" in got.reason


@pytest.mark.gpu
@pytest.mark.skipif(not FULL_HERE, reason="full containment (bubblewrap) is not available here")
def test_a_gpu_sandbox_starts_cuda(device_alone):
    import torch

    from kernelrl.judge.harness.device import Device

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    got = probe(Containment.FULL, SandboxConfig().uids, Device.CUDA)
    assert got.level is Containment.FULL, got.reason
