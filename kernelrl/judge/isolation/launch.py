"""Launchers: start a worker's process at one containment level, and hand back that process and the
channel to its interpreter (`Launched`); the judge's handle on it is `kernelrl.judge.isolation.sandbox.Worker`.

One launcher per level (`LAUNCHERS`): NONE starts the interpreter itself, NAMESPACES under `unshare`
and `setpriv` (`containment.NAMESPACES_PREFIX`), FULL under bubblewrap (`containment.bwrap_prefix`)
or, where `Launch.fork` allows, as a fork of a zygote joined to a bubblewrap sandbox made for it
(`kernelrl.judge.isolation.zygote`). Each makes the command pipes and the arena, gives the worker its
ends and keeps the judge's.

Guarantees: the worker's first process is in a session of its own, with the worker's log as its
stdout and stderr and its folder as cwd; it inherits the pipes, the arena, `Launch.inherit_fds`
and (FULL) bubblewrap's seccomp program, no other descriptor; it runs in its cgroup (where there
is one) from before anything is exec'd; bubblewrap is started from the judge's long-lived spawning
thread (`containment.spawn`); core dumps are off and (on CPU) the address space capped on it at
once. A launch that fails gives back the uid and the cgroup it took; the worker's ends of the
pipes and the seccomp program are closed in the judge either way.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kernelrl.judge.harness.channel import Arena, Channel
from kernelrl.judge.harness.device import Device, arch_env, device_minor, visible_device
from kernelrl.judge.harness.places import SCRATCH, SCRATCH_FOLDERS_ENV
from kernelrl.judge.harness.startup import LIMITS_ENV
from kernelrl.judge.isolation.cgroup import Cgroup
from kernelrl.judge.isolation.containment import (
    NAMESPACES_PREFIX,
    allocate_uid,
    bwrap_prefix,
    release_uid,
    spawn,
    widen_pipe,
)
from kernelrl.judge.isolation.seccomp import program_fd
from kernelrl.judge.isolation.zygote import Joined, fork_into
from kernelrl.result import Containment


@dataclass(frozen=True, kw_only=True)
class Launch:
    """What a launcher is told: where the worker runs, what it is given, and how it is contained."""

    device: Device
    device_index: int | None
    workdir: Path  # the judge's folder for the worker: its log, and its cwd
    environment: Callable[[Path, dict[str, str]], dict[str, str]]  # (its home, the launcher's variables) -> its env
    limits: dict[str, int]  # what the worker sets on itself before its hello (`LIMITS_ENV`)
    uids: tuple[int, int]  # FULL as root: the range its own uid is drawn from
    scratch_bytes: int  # FULL: its scratch's size
    expose: tuple[str, ...] = ()  # FULL: more folders shown read-only
    fork: bool = False  # FULL as root on CPU with a cgroup: a zygote's fork where one can be had
    inherit_fds: tuple[int, ...] = ()


@dataclass(kw_only=True)
class Launched:
    """A started worker: its first process (the interpreter, `unshare`, bubblewrap, or a forked worker's
    holder), the channel to its interpreter, and what the handle gives back when it ends."""

    proc: subprocess.Popen[bytes]
    channel: Channel
    arena: Arena
    log: BinaryIO
    log_path: Path
    cgroup: Cgroup | None
    uid: int | None = None  # FULL: the worker's own uid (drawn from `Launch.uids` as root)
    joined: Joined | None = None  # a forked worker's processes

    def log_tail(self, chars: int) -> str:
        """The last `chars` characters of the worker's log, as it wrote them (not yet redacted)."""
        with contextlib.suppress(OSError, ValueError):  # a killed worker's log is closed; its file stays
            self.log.flush()
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-chars:].decode(errors="replace")

    def release(self, *, uid_back: bool) -> None:
        """Let go of what the launch made, once its processes are gone: the worker's uid (given back
        where `uid_back`: FULL as root), its cgroup, its channel, arena and log."""
        if self.uid is not None and uid_back:
            release_uid(self.uid)
            self.uid = None
        if self.cgroup is not None:
            self.cgroup.remove()
        self.channel.close()
        self.arena.close()
        with contextlib.suppress(OSError):
            self.log.close()


@dataclass
class _Pipes:
    """The command pipes and the arena; the worker's ends go to its process, the judge keeps the others."""

    p2c_r: int
    p2c_w: int
    c2p_r: int
    c2p_w: int
    arena: Arena

    @classmethod
    def open(cls) -> _Pipes:
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        for fd in (p2c_w, c2p_w):
            widen_pipe(fd)
        # Sized before its first command (the handle's `size_arena`), else the default.
        return cls(p2c_r, p2c_w, c2p_r, c2p_w, Arena.create(None))

    @property
    def theirs(self) -> tuple[int, int, int]:
        return self.p2c_r, self.c2p_w, self.arena.fd


def _device_env(launch: Launch) -> tuple[dict[str, str], int | None]:
    """The worker's GPU variables, and its GPU's device node minor where the driver says it for certain."""
    index = launch.device_index or 0
    gpu = device_minor(visible_device(index)) if launch.device == Device.CUDA else None
    shown = gpu[1] if gpu else visible_device(index)  # the judge's own entry (index, UUID, MIG)
    extra = {"CUDA_VISIBLE_DEVICES": shown} if launch.device_index is not None or gpu else {}
    extra.update(arch_env(launch.device, index))  # TORCH_CUDA_ARCH_LIST on a GPU: exactly its architecture
    extra[LIMITS_ENV] = ",".join(f"{k}={v}" for k, v in launch.limits.items())
    return extra, gpu[0] if gpu else None


def _popen(launch: Launch, pipes: _Pipes, argv: list[str], env: dict[str, str], log: BinaryIO, cgroup: Cgroup | None,
           *, hold: bool = False, seccomp_fd: int | None = None) -> subprocess.Popen[bytes]:
    # A forked worker's channel goes to it through the zygote: the holder must not keep its pipes
    # open (the judge sees a worker's death as the end of its answer pipe).
    program = ["sleep", "infinity"] if hold else [sys.executable, "-m", "kernelrl.judge.harness.worker",
                                                  *map(str, pipes.theirs), str(pipes.arena.capacity)]
    argv = [*argv, *program]
    if cgroup is not None:
        argv = cgroup.join_argv(argv)
    own = () if hold else (*pipes.theirs, *launch.inherit_fds)
    fds = (*own, *([seccomp_fd] if seccomp_fd is not None else []))
    return subprocess.Popen(argv, pass_fds=fds, cwd=launch.workdir, env=env, stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)


def _launched(launch: Launch, prefix: list[str], home: Path, extra: dict[str, str], *,
              start: Callable[[_Pipes, dict[str, str], BinaryIO, Cgroup | None], tuple[subprocess.Popen[bytes],
                                                                                      Joined | None]] | None = None,
              uid: int | None = None, close: tuple[int, ...] = ()) -> Launched:
    """Start the worker under `prefix` (or through `start`), its cgroup joined first; on failure give
    its cgroup back and re-raise. The worker's ends of the pipes, and `close`, are closed either way."""
    pipes = _Pipes.open()
    env = launch.environment(home, extra)
    log_path = launch.workdir / "worker.log"
    log = open(log_path, "wb")  # noqa: SIM115 - kept open for the worker's life
    # Its own cgroup, joined before anything is exec'd: every process it ever starts is in it.
    cgroup = Cgroup.make()
    try:
        if start is not None:
            proc, joined = start(pipes, env, log, cgroup)
        else:
            proc, joined = _popen(launch, pipes, prefix, env, log, cgroup), None
    except BaseException:
        if cgroup is not None:
            cgroup.remove()
        raise
    finally:
        for fd in (pipes.p2c_r, pipes.c2p_w, *close):
            os.close(fd)
    launched = Launched(proc=proc, channel=Channel(pipes.c2p_r, pipes.p2c_w, pipes.arena), arena=pipes.arena,
                        log=log, log_path=log_path, cgroup=cgroup, uid=uid, joined=joined)
    _first_limits(launched, launch)
    return launched


def _first_limits(launched: Launched, launch: Launch) -> None:
    """Core dumps and address space on the first process, at once (best effort: the worker sets
    every limit on itself before it says hello, `LIMITS_ENV`)."""
    pid = launched.joined.pid if launched.joined is not None else launched.proc.pid
    try:
        resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
        if "as" in launch.limits:
            resource.prlimit(pid, resource.RLIMIT_AS, (launch.limits["as"], launch.limits["as"]))
    except (ProcessLookupError, PermissionError, OSError):
        pass  # the worker already died; the first request reports it


def launch_none(launch: Launch) -> Launched:
    """A plain child process in a session of its own."""
    extra, _ = _device_env(launch)
    return _launched(launch, [], launch.workdir, extra)


def launch_namespaces(launch: Launch) -> Launched:
    """Under `unshare` and `setpriv`: its own PID and mount namespaces, no capabilities."""
    extra, _ = _device_env(launch)
    return _launched(launch, list(NAMESPACES_PREFIX), launch.workdir, extra)


def launch_full(launch: Launch) -> Launched:
    """Under bubblewrap (`containment.py`'s docstring), spawned or forked from a zygote."""
    extra, minor = _device_env(launch)
    as_root = os.geteuid() == 0
    uid = allocate_uid(launch.uids) if as_root else os.getuid()
    seccomp_fd = program_fd()  # read once by bwrap; the probe made sure there is one
    prefix = bwrap_prefix(bwrap=shutil.which("bwrap") or "bwrap", uid=uid, device=launch.device,
                          scratch_bytes=launch.scratch_bytes, as_root=as_root, extra=launch.expose,
                          seccomp_fd=seccomp_fd, gpu_minor=minor)
    extra.update({**SCRATCH_FOLDERS_ENV, "USER": "kernelrl-worker", "LOGNAME": "kernelrl-worker"})

    def start(pipes: _Pipes, env: dict[str, str], log: BinaryIO,
              cgroup: Cgroup | None) -> tuple[subprocess.Popen[bytes], Joined | None]:
        # Forked only where its processes are found without its parentage (the cgroup: a forked
        # worker is not bubblewrap's descendant); descriptors to inherit by number (tests) come
        # only through a spawn.
        if launch.fork and as_root and cgroup is not None and not launch.inherit_fds and launch.device == Device.CPU:
            holder = spawn(lambda: _popen(launch, pipes, prefix, env, log, cgroup, hold=True, seccomp_fd=seccomp_fd))
            joined = fork_into(holder, env, uid=uid, cgroup=cgroup, arena=pipes.arena,
                               fds=(pipes.p2c_r, pipes.c2p_w, pipes.arena.fd, log.fileno()))
            if joined is not None:
                return holder, joined
            if seccomp_fd is not None:
                os.lseek(seccomp_fd, 0, os.SEEK_SET)  # read by the holder's bubblewrap; again for the next
        # bwrap dies with the thread that started it: the judge's long-lived one starts it.
        return spawn(lambda: _popen(launch, pipes, prefix, env, log, cgroup, seccomp_fd=seccomp_fd)), None

    try:
        return _launched(launch, prefix, Path(SCRATCH), extra, start=start, uid=uid,
                         close=(seccomp_fd,) if seccomp_fd is not None else ())
    except BaseException:
        if as_root:
            release_uid(uid)
        raise


LAUNCHERS: dict[Containment, Callable[[Launch], Launched]] = {
    Containment.NONE: launch_none, Containment.NAMESPACES: launch_namespaces, Containment.FULL: launch_full}
