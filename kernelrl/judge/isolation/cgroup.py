"""Per-worker cgroups (v2): every process a worker starts, whatever its parentage, counted and ended.

A worker's first process joins a cgroup of its own before it execs anything (`Cgroup.join_argv`),
so every process it or any descendant starts is in that cgroup, whichever session, process group
or parent it moves to (an orphan adopted by a sandbox's pid 1, by the judge's init, anywhere).
The kernel then answers three questions no process in it can forge:

- `usage_ns`: the CPU time of every process that was ever in it, dead ones included (a helper
  that burnt for a millisecond and was reaped by a parent ignoring SIGCHLD still counts);
- `pids`: every live process in it;
- `kill`: all of them end at once (cgroup.kill, Linux 5.14+; else each pid, until none is left).

Why a cgroup and not the freezer or a /proc census: the judge measures a worker's CPU between
its answer and its next command (work left running is a finding), so freezing an idle worker
would hide that; a /proc census sees only live processes that are descendants of one it knows.

Guarantees:
- `available()` is True only where a cgroup v2 hierarchy is mounted and the judge can make a
  cgroup under its own and move a process into it (root, or a delegated subtree); it is decided
  once per judge process by trying;
- a worker process cannot leave its cgroup: it runs under another uid (full containment) and /sys
  is read-only in its sandbox; moving needs write access to the cgroup files the judge owns;
- every cgroup made is removed once empty (`remove`), and the judge's folder at exit.

Does not guarantee: CPU or memory limits (no controller is enabled: `cpu.stat` is counted for
every cgroup without one), or anything where `available()` is False; then sandbox.py falls
back to the /proc census (`kernelrl.judge.isolation.containment.sandbox_processes`).
"""

from __future__ import annotations

import atexit
import functools
import os
import secrets
import signal
import subprocess
import threading
import time
from pathlib import Path

_MOUNTINFO = "/proc/self/mountinfo"


def _v2_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted, shown at the judge's own cgroup; None if not."""
    own = None
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    own = line[3:].strip()
        with open(_MOUNTINFO) as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] != "cgroup2":
                    continue
                fields = left.split()
                root, point = fields[3], fields[4]
                if own is None:
                    return None
                rel = own if root == "/" else own.removeprefix(root) if own.startswith(root) else None
                if rel is None:
                    continue
                path = Path(point) / rel.lstrip("/")
                if (path / "cgroup.procs").exists():
                    return path
    except OSError:
        return None
    return None


class Cgroup:
    """One worker's cgroup (`Cgroup.make()`; None where cgroups are not `available()`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def make(cls) -> Cgroup | None:
        base = _judge_folder()
        if base is None:
            return None
        path = base / f"w-{secrets.token_hex(6)}"
        try:
            path.mkdir()
        except OSError:
            return None
        return cls(path)

    def join_argv(self, argv: list[str]) -> list[str]:
        """`argv`, run by a shell that first moves itself into this cgroup (and fails if it cannot)."""
        return ["/bin/sh", "-c", 'echo 0 > "$0" || exit 125; exec "$@"', str(self.path / "cgroup.procs"), *argv]

    def pids(self) -> list[int]:
        """Every live process in the cgroup, as the judge numbers them."""
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def usage_ns(self) -> int | None:
        """CPU time of every process that was ever in the cgroup (kernel's count, microseconds)."""
        try:
            for line in (self.path / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) * 1000
        except (OSError, ValueError):
            return None
        return None

    def populated(self) -> bool:
        try:
            for line in (self.path / "cgroup.events").read_text().splitlines():
                if line.startswith("populated "):
                    return line.split()[1] != "0"
        except OSError:
            return False
        return bool(self.pids())

    def kill(self, timeout_s: float = 10.0) -> bool:
        """End every process in the cgroup and wait until none is left; whether it emptied."""
        try:
            (self.path / "cgroup.kill").write_text("1")
        except OSError:
            pass  # before Linux 5.14: each pid below
        end = time.monotonic() + timeout_s
        while self.populated():
            for pid in self.pids():
                kill_pid(pid)
            if time.monotonic() > end:
                return False
            time.sleep(0.005)
        return True

    def remove(self) -> None:
        """Remove the (empty) cgroup; a populated one is killed first."""
        if self.populated():
            self.kill()
        try:
            self.path.rmdir()
        except OSError:
            pass


def kill_pid(pid: int) -> None:
    """SIGKILL `pid` through a pidfd where there is one (no other process that reused the pid is hit)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        return
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


_lock = threading.Lock()


@functools.cache
def _judge_folder() -> Path | None:
    """This judge's folder of worker cgroups, made and tried once; None where it cannot be used."""
    with _lock:
        mount = _v2_mount()
        if mount is None or not os.access(mount, os.W_OK):
            return None
        _sweep(mount)
        base = mount / f"kernelrl-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            base.mkdir()
        except OSError:
            return None
        trial = Cgroup(base / "probe")
        try:
            trial.path.mkdir()
            done = subprocess.run(trial.join_argv(["/bin/sh", "-c", 'cat /proc/self/cgroup']), capture_output=True,
                                  timeout=10, stdin=subprocess.DEVNULL)
            ok = done.returncode == 0 and f"/{base.name}/probe" in done.stdout.decode(errors="replace")
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        trial.remove()
        if not ok:
            _rmdir(base)
            return None
        atexit.register(_rmdir, base)
        return base


def available() -> bool:
    """Whether workers get cgroups of their own here (see the module docstring)."""
    return _judge_folder() is not None


def _rmdir(base: Path) -> None:
    try:
        for child in base.iterdir():
            if child.is_dir():
                Cgroup(child).remove()
        base.rmdir()
    except OSError:
        pass


def _sweep(mount: Path) -> None:
    """Folders left by judges that died (their pid is gone): emptied and removed."""
    try:
        folders = [p for p in mount.iterdir() if p.name.startswith("kernelrl-") and p.is_dir()]
    except OSError:
        return
    for folder in folders:
        pid = folder.name.split("-")[1]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _rmdir(folder)
