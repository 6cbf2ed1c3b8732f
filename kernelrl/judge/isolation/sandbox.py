"""The sandbox: a worker process with its own interpreter, directory, limits and env, and the judge's
thin handle on it (`Worker`). The process is started by the launcher of its containment level
(`kernelrl.judge.isolation.launch`), which returns it with its channel; its commands and answers
go through `kernelrl.judge.isolation.exchange`; what the kernel says of its processes is read, and
they are ended, through `kernelrl.judge.isolation.processes`.

Guarantees:
- a worker is never a fork of the judge: it is a fresh interpreter (`python -m
  kernelrl.judge.harness.worker`) or, under FULL containment as root on CPU with a cgroup of its own
  (`SandboxConfig.fork_workers`), a fork of a zygote (`kernelrl.judge.isolation.zygote`: an interpreter
  spawned with a worker's environment that has torch imported) joined to a bubblewrap sandbox
  made for it, contained as a spawned one is; in its own session (process group), with its own
  scratch folder as cwd, HOME and TMPDIR;
- it is contained as well as this machine allows, no better than `SandboxConfig.containment`
  (`kernelrl.judge.isolation.containment`: FULL through bubblewrap, NAMESPACES through unshare, NONE), and
  says which (`Worker.containment`); where FULL was asked for and is not available, the level is
  lower and the pool says why (`WorkerPool.containment_notice`), never silently;
- its environment is built from an allow-list (`ENV_ALLOW`) plus the variables the judge sets;
  API keys, tokens and the judge's secrets never reach it because nothing else is copied;
- core dumps off; open files and file size capped (`max_open_files`, `max_file_mib`); under FULL
  containment also the number of processes (`max_processes`, for the worker's uid alone); an
  address-space cap on CPU (CUDA reserves huge virtual ranges); all set on the interpreter
  before it is given any program;
- the glibc allocator is pinned (fixed mmap and trim thresholds) so large-tensor timings do not
  swing with glibc's adaptive threshold; OpenMP threads sleep when idle, so idle CPU is a signal;
- descriptors named in `inherit_fds` (besides the command pipe) reach the worker; no other does;
- `kill()` ends the whole process group and, when namespaced, the worker's PID namespace (every
  process the program started, in any session), waits for it, and never raises;
- every process the worker starts is found whatever its parentage: where cgroups are available
  (`kernelrl.judge.isolation.cgroup`) the worker runs in a cgroup of its own, which `kill()` ends at once;
  elsewhere the judge walks the sandbox's process tree (orphans are adopted by the sandbox's
  first process under FULL and NAMESPACES);
- what a worker says that can reach a verdict (an error's message and traceback, its log tail)
  passes through `kernelrl.judge.isolation.redact` first: no host path, system file line, interface name
  or value of the judge's environment;
- the judge reads the worker's CPU time from the kernel, never the worker's word: the cgroup's
  count (every process it ever held, dead ones included), else every live process of the sandbox
  (each one's threads and reaped children); and its thread count from /proc;
- from the timing pool on (`Kind.POOL`), every process of the worker other than its interpreter
  (and bubblewrap's own; a forked worker's holder and keeper) is ended before the command is
  sent and again as soon as an answer arrives (`end_strays`, counted in `strays_ended`): no
  helper a program started runs while another member of its group is timed;
- every output handed over for a spot check is checked against the commitment its call made
  when it returned (`Called.commits`, `kernelrl.judge.harness.channel.commitment`): one computed only
  when asked for cannot match (`uncommitted_outputs`, `kernelrl.checks.dynamic.output_deferred`).

Does not guarantee isolation below FULL: under NAMESPACES the worker writes what root can write
and reaches the network; under NONE it also reads the /proc of the judge's other processes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from kernelrl.judge.harness.channel import Arena, Channel, ChannelProtocolError
from kernelrl.judge.harness.device import Device
from kernelrl.judge.harness.protocol import Header, Hello, Kind
from kernelrl.judge.harness.startup import NO_HUGE_PAGES_ENV, PINNED_ALLOCATOR_ENV
from kernelrl.judge.isolation.cgroup import Cgroup
from kernelrl.judge.isolation.containment import (
    Scratch,
    namespaces_available,
    probe,
    process_limit,
)
from kernelrl.judge.isolation.exchange import Answer, Exchanges
from kernelrl.judge.isolation.inductor import inductor_env
from kernelrl.judge.isolation.launch import LAUNCHERS, Launch
from kernelrl.judge.isolation.processes import WorkerProcesses
from kernelrl.judge.isolation.redact import redact
from kernelrl.judge.isolation.zygote import Joined
from kernelrl.result import Containment

# Copied from the judge's environment when present; everything else is dropped.
ENV_ALLOW = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_HOME", "CUDA_PATH", "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
    "CC", "CXX", "TORCH_CUDA_ARCH_LIST", "TRITON_INTERPRET",
)
# the folder that holds the kernelrl package (this file is kernelrl/judge/isolation/sandbox.py)
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])


def isolation_available() -> bool:
    """Whether workers can run with a private /proc here (root and working namespaces)."""
    return namespaces_available()


class WorkerDied(RuntimeError):
    """The worker exited or was killed while the judge waited for an answer."""

    def __init__(self, message: str, *, role: str, returncode: int | None, log_tail: str):
        super().__init__(message)
        self.role = role
        self.returncode = returncode
        self.log_tail = log_tail


@dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    threads: int = 0  # intra-op threads for torch/OpenMP; 0 = every core this process may use but one
    memory_limit_gib: float | None = 16.0  # address-space cap on CPU; None = no cap
    pin_allocator: bool = True
    # During group timing, every member is bound to the same cores (see `timing_cores`).
    bind_timing: bool = True
    # The most containment to try (kernelrl.judge.isolation.containment): FULL falls back, saying so, to
    # NAMESPACES or NONE where bubblewrap is missing or cannot make namespaces.
    containment: Containment = Containment.FULL
    max_processes: int = 0  # processes and threads of one worker (FULL only); 0 = 256 + 8 per core
    max_open_files: int = 4096
    max_file_mib: int = 1024  # the largest file a worker may write (its log included)
    scratch_mib: int = 1024  # size of its /tmp and of its /dev/shm (FULL only; each a tmpfs, in memory)
    # Worker uids when the judge is root (FULL): one per live worker, drawn from [lo, hi).
    uids: tuple[int, int] = (1_900_000_000, 1_900_000_000 + (1 << 20))
    expose: tuple[str, ...] = ()  # more folders shown read-only under FULL (a toolchain outside /usr, /opt)
    log_tail_chars: int = 4000
    # Under FULL as root on CPU, with a cgroup per worker: a worker is a fork of a zygote that has
    # torch imported, joined to its own bubblewrap sandbox (kernelrl.judge.isolation.zygote), which starts in
    # ~60 ms instead of the ~1.8 s of an interpreter importing torch. False: always spawned.
    fork_workers: bool = True

    def __post_init__(self) -> None:
        if self.threads < 0:
            raise ValueError("threads must be >= 0")
        object.__setattr__(self, "containment", Containment(self.containment))
        if self.max_processes < 0 or self.max_open_files < 64 or self.max_file_mib < 1 or self.scratch_mib < 16:
            raise ValueError("max_processes must be >= 0, max_open_files >= 64, max_file_mib >= 1, scratch_mib >= 16")
        lo, hi = self.uids
        if not 1000 <= lo < hi <= 2**31 - 1:
            raise ValueError("uids must be a range [lo, hi) with 1000 <= lo < hi < 2**31")
        if self.memory_limit_gib is not None and self.memory_limit_gib <= 0.5:
            raise ValueError("memory_limit_gib must be > 0.5 GiB (torch alone needs more) or None")

    @property
    def process_limit(self) -> int:
        return self.max_processes or 256 + 8 * (os.cpu_count() or 1)

    @property
    def effective_threads(self) -> int:
        # One core stays with the judge, the OS and idle workers. A parallel region waits for its
        # slowest thread, so a worker spread over every core stalls whenever anything else runs:
        # on two cores, two threads gave identical code per-round ratios far wider than one thread
        # (benchmarks/README.md, timing noise) and kept the +-1 % stop from firing.
        if self.threads:
            return self.threads
        cores = _own_cores()
        return max(1, (len(cores) if cores else os.cpu_count() or 1) - 1)


def _own_cores() -> list[int] | None:
    """The cores this process may run on, in order; None where the OS cannot say (not Linux)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return None


def timing_cores(config: SandboxConfig) -> frozenset[int] | None:
    """The cores every member of a timed group is bound to while it is timed.

    The `effective_threads` highest-numbered cores of the judge's own set, leaving the lowest to
    the judge. Unbound, an idle worker is woken on whichever core it last ran on, and it keeps
    that habit for its life: where cores differ in speed (virtual CPUs on a shared host), two
    processes running identical code then measure a few percent apart for as long as they live
    (benchmarks/README.md, timing noise). None where binding is off or there is a single core.
    """
    cores = _own_cores() if config.bind_timing else None
    if cores is None or len(cores) < 2:
        return None
    return frozenset(cores[-min(config.effective_threads, len(cores) - 1):])


_SIGNALS = frozenset(int(sig) for sig in signal.Signals)


def worker_env(config: SandboxConfig, workdir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    threads = str(config.effective_threads)
    env.update({
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "PYTHONPATH": _PACKAGE_PARENT,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "MAX_JOBS": threads,
        # Idle OpenMP threads must not spin: CPU used while a worker waits is how the judge
        # sees work left running after a call returned.
        "OMP_WAIT_POLICY": "PASSIVE",
        "GOMP_SPINCOUNT": "0",
        # No network for programs under test: hub libraries fail at once instead of retrying.
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    })
    env.update(inductor_env())  # torch.compile in this process, no work every worker repeats
    if config.pin_allocator:
        env.update(PINNED_ALLOCATOR_ENV)
        env[NO_HUGE_PAGES_ENV] = "1"
    if extra:
        env.update(extra)
    return env


def worker_limits(cfg: SandboxConfig, device: Device, containment: Containment) -> dict[str, int]:
    """The limits a worker sets on itself before it says hello (resource name -> value)."""
    out = {"core": 0, "nofile": cfg.max_open_files, "fsize": cfg.max_file_mib << 20}
    if cfg.memory_limit_gib is not None and device == "cpu":
        out["as"] = int(cfg.memory_limit_gib * (1 << 30))
    if containment is Containment.FULL:
        out["nproc"] = cfg.process_limit  # counted for the worker's own uid (or user namespace)
    return out


def _death(what: str, rc: int | None, bwrap: bool) -> tuple[str, int | None]:
    """What a dead worker's exit status says, and the status (bubblewrap's 128 + N as the signal N)."""
    if rc is not None and bwrap and rc > 128 and rc - 128 in _SIGNALS:
        rc = 128 - rc  # bubblewrap exits 128 + N when its program was killed by signal N
    if rc is not None and rc < 0:
        try:
            sig = signal.Signals(-rc).name
        except ValueError:
            sig = f"signal {-rc}"
        return f"{what}: killed by {sig}", rc
    return (f"{what}: exit status {rc}" if rc is not None else what), rc


class Worker:
    """The judge's handle on one worker process: started by the launcher of its containment level
    (`kernelrl.judge.isolation.launch`), talked to through its channel (`kernelrl.judge.isolation.exchange`),
    watched and ended through its processes (`kernelrl.judge.isolation.processes`).

    A worker is started bare (a fresh interpreter that imports torch and says hello) and is given
    one program: its owner sets `role` ("reference", "candidate", ...) for messages. It is never
    given a second program.
    """

    def __init__(self, *, config: SandboxConfig, device: Device, device_index: int | None = None,
                 root: Path | None = None, role: str = "worker", inherit_fds: tuple[int, ...] = ()):
        self.role, self.config, self.device = role, config, device
        self.containment = probe(config.containment, config.uids, device).level
        # The judge's folder for this worker: its log (under FULL containment its scratch is a tmpfs, `scratch()`).
        self.workdir = Path(tempfile.mkdtemp(prefix="kernelrl-worker-", dir=root))
        self.hello: Hello | None = None
        self._launched = LAUNCHERS[self.containment](Launch(
            device=device, device_index=device_index, workdir=self.workdir, environment=partial(worker_env, config),
            limits=worker_limits(config, device, self.containment), uids=config.uids,
            scratch_bytes=config.scratch_mib << 20, expose=config.expose, fork=config.fork_workers, inherit_fds=inherit_fds))
        self._procs = WorkerProcesses(self.proc, self.containment, self.cgroup, self._launched.joined)
        # its commands and answers (`kernelrl.judge.isolation.exchange`)
        self._talk = Exchanges(self.channel, self.arena, end_strays=self._procs.end_strays, died=self._died)
        self.started = time.monotonic()

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self._launched.proc

    @property
    def channel(self) -> Channel:
        return self._launched.channel

    @property
    def arena(self) -> Arena:
        return self._launched.arena

    @property
    def cgroup(self) -> Cgroup | None:
        return self._launched.cgroup

    @property
    def uid(self) -> int | None:
        """The worker's own uid under FULL containment (drawn per worker as root)."""
        return self._launched.uid

    @property
    def log_path(self) -> Path:
        return self._launched.log_path

    @property
    def forked(self) -> bool:
        """Whether the worker is a fork of a zygote (`SandboxConfig.fork_workers`), not spawned."""
        return self._launched.joined is not None

    @property
    def _joined(self) -> Joined | None:
        return self._launched.joined

    @property
    def isolated(self) -> bool:
        """Whether the worker has its own PID namespace (a private /proc)."""
        return self.containment is not Containment.NONE

    def size_arena(self, need: int) -> None:
        """The arena's size for good (`kernelrl.judge.harness.channel.arena_need` of the task's messages): set
        before the worker is given its program, so a program cannot pin more memory through it."""
        self._talk.size_arena(need)

    def wait_ready(self, *, deadline: float | None = None) -> Hello:
        """The worker's hello (interpreter up, torch imported); WorkerDied if it never comes.

        On hello, before the worker can be given any program, the judge finds the interpreter's
        process, sets its limits and notes its scratch's file system.
        """
        if self.hello is None:
            answer = self._talk.receive(deadline)
            if answer.kind is not Kind.HELLO:
                raise ChannelProtocolError(f"expected hello, got {answer.kind.value}")
            self.hello = answer.header
            if not self._procs.find(self.hello.pid):
                raise self._died("the worker's interpreter is not among its sandbox's processes")
            if self.containment is Containment.FULL:
                # Read back from the kernel, not taken on the worker's word.
                if process_limit(self.pid) != self.config.process_limit:
                    raise self._died("the worker's process limit is not in force")
                self._procs.note_scratch()
        return self.hello

    def scratch(self) -> Scratch | None:
        """The judge's view of this worker's scratch (FULL containment, worker alive); None otherwise."""
        dev = self._procs.scratch_dev
        if self.containment is not Containment.FULL or dev is None or self.uid is None:
            return None
        return Scratch.open(self.pid, pid_fd=self._procs.pid_fd, dev=dev, uid=self.uid)

    def request(self, header: Header, payload: Any = None, *, deadline: float | None = None) -> Answer:
        """Send one command and wait for its answer (ChannelTimeout past the deadline). The answer
        must be the kind the command allows, or an error; anything else is a ChannelProtocolError."""
        return self._exchange(header.KIND, header, payload, deadline)

    def command(self, kind: Kind, payload: Any = None, *, deadline: float | None = None) -> Answer:
        """A command without fields (get_state, pool, call, output...)."""
        return self._exchange(kind, None, payload, deadline)

    def _exchange(self, kind: Kind, header: Header | None, payload: Any, deadline: float | None) -> Answer:
        if self.hello is None:
            self.wait_ready(deadline=deadline)
        return self._talk.exchange(kind, header, payload, deadline)

    def _died(self, what: str) -> WorkerDied:
        bwrap = not self._procs.keeper_reports and self.containment is Containment.FULL
        reason, rc = _death(what, self._procs.returncode(), bwrap)
        return WorkerDied(reason, role=self.role, returncode=rc, log_tail=self.log_tail())

    def log_tail(self) -> str:
        return redact(self._launched.log_tail(self.config.log_tail_chars))

    @property
    def pid(self) -> int:
        """The interpreter's pid as the judge sees it (found among the sandbox's processes on hello)."""
        return self._procs.pid

    @property
    def last_exchange_ns(self) -> int:
        """The last command's send to its answer, by the judge's clock."""
        return self._talk.last_exchange_ns

    @property
    def spot_outputs(self) -> int:
        return self._talk.outputs

    @property
    def uncommitted_outputs(self) -> int:
        return self._talk.uncommitted

    @property
    def strays_ended(self) -> int:
        return self._procs.strays_ended

    @property
    def stray_check_ns(self) -> int:
        return self._procs.stray_check_ns

    def processes(self) -> list[int]:
        return self._procs.processes()

    def strays(self) -> list[int]:
        return self._procs.strays()

    def end_strays(self) -> int:
        return self._procs.end_strays()

    def cpu_time_ns(self) -> int | None:
        return self._procs.cpu_time_ns()

    def child_count(self) -> int:
        """Live processes of the worker besides its interpreter (`strays`): a build's compiler counts
        while it runs, and so does a helper wherever it was reparented."""
        return len(self._procs.strays())

    def thread_count(self) -> int | None:
        return self._procs.thread_count()

    def bind(self, cores: frozenset[int] | None) -> None:
        self._procs.bind(cores)

    def kill(self) -> None:
        """End the worker and everything it started; wait until they are gone (10 s at most)."""
        self._procs.end()
        self._launched.release(uid_back=self.containment is Containment.FULL and os.geteuid() == 0)

    def close(self, *, keep_dir: bool = False) -> None:
        """Ask the worker to exit, then make sure the whole group is gone and clean up."""
        if self.proc.poll() is None:
            try:
                self.channel.send(Kind.EXIT.value, {})
                self._procs.wait_exit(2.0)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        if not keep_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

