"""A worker's processes as the kernel shows them: its interpreter found among its sandbox's processes,
the helpers it started, its CPU time and threads, and the end of all of them (`WorkerProcesses`).

Guarantees (the facts `kernelrl.judge.isolation.sandbox.Worker` reports, none taken on the worker's
word): every process the worker starts is found whatever its parentage, through its cgroup where
there is one, else by walking its sandbox's process tree (orphans are adopted by the sandbox's
first process under FULL and NAMESPACES); its CPU time is the cgroup's count (every process it
ever held, dead ones included), else the sum over every live process of the sandbox (each one's
threads and reaped children); `end` ends the cgroup, the process group and the PID namespace's
first process (only while its pidfd says it lives: a pid that ended may name another process now),
waits for them (10 s at most) and never raises.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from kernelrl.judge.harness.places import SCRATCH
from kernelrl.judge.isolation.cgroup import Cgroup, kill_pid
from kernelrl.judge.isolation.containment import (
    exited,
    find_in_namespace,
    ns_pid,
    pidfd,
    process_cpu_ns,
    sandbox_processes,
)
from kernelrl.judge.isolation.zygote import Joined, read_status
from kernelrl.result import Containment


class WorkerProcesses:
    """The processes of one worker: its first process (`proc`), its interpreter once found, the first
    process of its PID namespace, and the strays ended around its exchanges."""

    def __init__(self, proc: subprocess.Popen[bytes], containment: Containment, cgroup: Cgroup | None,
                 joined: Joined | None):
        self.proc, self.containment, self.cgroup, self.joined = proc, containment, cgroup, joined
        self.inner_pid: int | None = None
        self.ns_init: int | None = None  # the first process of its PID namespace (killing it ends them all)
        # Readable once the interpreter, the namespace's first process has exited; a forked worker's
        # exit code, written by its keeper.
        self._fds: dict[str, int | None] = {"pid": None, "init": None, "status": joined.status_r if joined else None}
        self._exit: int | None = None  # that exit code, once read
        self.scratch_dev: int | None = None  # FULL: the device of its scratch's file system
        self.strays_ended = 0
        self.stray_check_ns = 0  # spent on `end_strays` (the census around every exchange), by the judge's clock

    @property
    def pid(self) -> int:
        """The interpreter's pid as the judge sees it (found among the sandbox's processes on hello)."""
        return self.inner_pid if self.inner_pid is not None else self.proc.pid

    @property
    def pid_fd(self) -> int | None:
        return self._fds["pid"]

    def find(self, pid_in_namespace: int) -> bool:
        """Find the interpreter that said hello as `pid_in_namespace`; False where it is not among
        the sandbox's processes. Under FULL, notes its scratch's file system."""
        if self.containment is not Containment.NONE:
            inner, self.ns_init = find_in_namespace(self.proc.pid, pid_in_namespace)
            if self.joined is not None:  # not bubblewrap's descendant: known from the zygote
                inner = self.joined.pid if ns_pid(self.joined.pid) == pid_in_namespace else None
            if inner is None:
                return False
            self.inner_pid = inner
            self._fds["pid"] = pidfd(inner)
            if self.ns_init is not None:
                self._fds["init"] = pidfd(self.ns_init)
        return True

    def note_scratch(self) -> None:
        try:
            self.scratch_dev = os.stat(f"/proc/{self.pid}/root{SCRATCH}").st_dev
        except OSError:
            self.scratch_dev = None  # no build reaches the cache from this worker

    @property
    def keeper_reports(self) -> bool:
        """Whether the worker's exit status is its keeper's word (a forked worker), not its first process's."""
        return self._fds["status"] is not None

    def returncode(self) -> int | None:
        """How the worker ended: its keeper's word for a forked worker (written once: kept for a second
        report of the same death), else its first process's exit status (None: still running after 5 s)."""
        status = self._fds["status"]
        if status is not None:
            self._exit = self._exit if self._exit is not None else read_status(status, 5.0)
            return self._exit
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def wait_exit(self, timeout_s: float) -> None:
        """Wait for the worker to exit (`subprocess.TimeoutExpired` past the timeout; a forked worker's
        keeper: up to the timeout, then on)."""
        status = self._fds["status"]
        if status is not None:  # bubblewrap holds a `sleep`: the worker's exit is the keeper's word
            read_status(status, timeout_s)
        else:
            self.proc.wait(timeout=timeout_s)

    def processes(self) -> list[int]:
        """Every live process of the worker, whatever its parentage (its cgroup, else its sandbox's tree)."""
        if self.cgroup is not None:
            return self.cgroup.pids()
        return sandbox_processes(self.proc.pid)

    def strays(self) -> list[int]:
        """The worker's processes other than its interpreter, bubblewrap's own and a forked worker's
        holder and keeper (a build's compiler while it runs; a helper a program started, wherever
        it was reparented)."""
        own = {self.proc.pid, self.ns_init, self.pid}
        if self.joined is not None:
            own |= {self.joined.holder, self.joined.keeper}
        return [p for p in self.processes() if p not in own]

    def end_strays(self) -> int:
        """Kill every stray (`strays`) until none is left; how many were ended."""
        clock = time.perf_counter_ns()
        ended: set[int] = set()
        for _ in range(100):
            found = self.strays()
            if not found:
                break
            for p in found:
                kill_pid(p)
            ended.update(found)
            time.sleep(0.001)  # a killed process leaves the cgroup once it has exited
        self.strays_ended += len(ended)
        self.stray_check_ns += time.perf_counter_ns() - clock
        return len(ended)

    def cpu_time_ns(self) -> int | None:
        """CPU time of every process of the worker (see the module docstring), from the kernel."""
        if self.cgroup is not None:
            used = self.cgroup.usage_ns()
            if used is not None:
                return used
        pids = [self.pid] if self.containment is Containment.NONE and self.cgroup is None else self.processes()
        if self.pid not in pids and not os.path.exists(f"/proc/{self.pid}"):
            return None
        return sum(process_cpu_ns(p) for p in {*pids, self.pid})

    def thread_count(self) -> int | None:
        try:
            return len(os.listdir(f"/proc/{self.pid}/task"))
        except (FileNotFoundError, ProcessLookupError):
            return None

    def bind(self, cores: frozenset[int] | None) -> None:
        """Bind every thread of the worker to `cores` (None: back to the judge's own set).

        Threads the worker starts later inherit their creator's set. A worker that is gone is
        left alone: its failure is reported by whoever talks to it next.
        """
        target = set(cores) if cores is not None else os.sched_getaffinity(0)
        try:
            tids = os.listdir(f"/proc/{self.pid}/task")
        except (FileNotFoundError, ProcessLookupError):
            return
        for tid in tids:
            try:
                os.sched_setaffinity(int(tid), target)
            except (ProcessLookupError, PermissionError):
                continue  # a thread ended while we bound the others

    def end(self) -> None:
        """End every process of the worker and wait until they are gone (10 s at most)."""
        if self.cgroup is not None:
            self.cgroup.kill()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        init_fd = self._fds["init"]
        if self.ns_init is not None and init_fd is not None and not exited(init_fd):
            # The first process of the PID namespace: the kernel ends every other one with it,
            # whatever session or process group they moved to.
            try:
                os.kill(self.ns_init, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        # The namespace's first process exits only once every process in it has.
        exited(init_fd, 10.0)
        if self._fds["status"] is not None:  # the keeper, unless killed with the cgroup, ends once it wrote
            read_status(self._fds["status"], 10.0)
        for fd in self._fds.values():
            if fd is not None:
                os.close(fd)
        self._fds = {"pid": None, "init": None, "status": None}
        self.ns_init = None
