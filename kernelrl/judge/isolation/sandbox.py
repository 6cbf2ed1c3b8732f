"""The sandbox: a worker process with its own interpreter, directory, limits and env.

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

import contextlib
import dataclasses
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelrl.judge.harness.channel import (
    DEFAULT_ARENA_BYTES,
    Arena,
    Channel,
    ChannelClosed,
    ChannelProtocolError,
    commitment,
)
from kernelrl.judge.harness.device import Device, arch_env, device_minor, visible_device
from kernelrl.judge.harness.places import SCRATCH, SCRATCH_FOLDERS_ENV
from kernelrl.judge.harness.protocol import ANSWERS, Error, Header, Hello, Kind, Output, decode, encode
from kernelrl.judge.harness.startup import LIMITS_ENV, NO_HUGE_PAGES_ENV, PINNED_ALLOCATOR_ENV
from kernelrl.judge.isolation.cgroup import Cgroup, kill_pid
from kernelrl.judge.isolation.containment import (
    NAMESPACES_PREFIX,
    Scratch,
    allocate_uid,
    bwrap_prefix,
    exited,
    find_in_namespace,
    namespaces_available,
    ns_pid,
    pidfd,
    probe,
    process_cpu_ns,
    process_limit,
    release_uid,
    sandbox_processes,
    spawn,
    widen_pipe,
)
from kernelrl.judge.isolation.inductor import inductor_env
from kernelrl.judge.isolation.redact import redact
from kernelrl.judge.isolation.seccomp import program_fd
from kernelrl.judge.isolation.zygote import Joined, fork_into, read_status
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


@dataclass(frozen=True)
class Answer:
    """A worker's typed answer to one command (`kernelrl.judge.harness.protocol`)."""

    kind: Kind
    header: Any
    payload: Any = None

    @property
    def failed(self) -> bool:
        return self.kind is Kind.ERROR


class Worker:
    """The judge's handle on one worker process.

    A worker is started bare (a fresh interpreter that imports torch and says hello) and is given
    one program: its owner sets `role` ("reference", "candidate", ...) for messages. It is never
    given a second program.
    """

    def __init__(self, *, config: SandboxConfig, device: Device, device_index: int | None = None,
                 root: Path | None = None, role: str = "worker", inherit_fds: tuple[int, ...] = ()):
        self.role = role
        self.config = config
        self.device = device
        # The judge's folder for this worker: its log (under FULL containment its scratch is a tmpfs, `scratch()`).
        self.workdir = Path(tempfile.mkdtemp(prefix="kernelrl-worker-", dir=root))
        self.log_path = self.workdir / "worker.log"
        found = probe(config.containment, config.uids, device)
        self.containment = found.level
        self.uid: int | None = None  # the worker's own uid under FULL containment as root
        self._scratch_dev: int | None = None
        self._pidfd: int | None = None  # readable once the interpreter has exited
        self._ns_init: int | None = None  # the first process of its PID namespace (killing it ends them all)
        self._init_fd: int | None = None  # readable once that one has exited
        self._inner_pid: int | None = None
        self._joined: Joined | None = None  # a forked worker's processes (kernelrl.judge.isolation.zygote)
        self._status_r: int | None = None  # a forked worker's exit code, written by its keeper
        self._exit: int | None = None  # that exit code, once read
        self.hello: Hello | None = None
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        # Sized before its first command: to `size_arena`'s need (a candidate), else the default.
        self.arena = Arena.create(None)
        self._arena_need: int | None = None
        for fd in (p2c_w, c2p_w):
            widen_pipe(fd)
        gpu = device_minor(visible_device(device_index or 0)) if device == Device.CUDA else None  # device.py
        shown = gpu[1] if gpu else visible_device(device_index or 0)  # the judge's own entry (index, UUID, MIG)
        extra = {"CUDA_VISIBLE_DEVICES": shown} if device_index is not None or gpu else {}
        extra.update(arch_env(device, device_index or 0))  # TORCH_CUDA_ARCH_LIST on a GPU: exactly its architecture
        full = self.containment is Containment.FULL
        seccomp_fd: int | None = None
        if full:
            as_root = os.geteuid() == 0
            self.uid = allocate_uid(config.uids) if as_root else os.getuid()
            seccomp_fd = program_fd()  # read once by bwrap; the probe made sure there is one
            prefix = bwrap_prefix(bwrap=shutil.which("bwrap") or "bwrap", uid=self.uid, device=device,
                                  scratch_bytes=config.scratch_mib << 20, as_root=as_root, extra=config.expose,
                                  seccomp_fd=seccomp_fd, gpu_minor=gpu[0] if gpu else None)
            extra.update({**SCRATCH_FOLDERS_ENV, "USER": "kernelrl-worker", "LOGNAME": "kernelrl-worker"})
        else:
            prefix = list(NAMESPACES_PREFIX) if self.containment is Containment.NAMESPACES else []
        extra[LIMITS_ENV] = ",".join(f"{k}={v}" for k, v in self.limits().items())
        env = worker_env(config, Path(SCRATCH) if full else self.workdir, extra)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - kept open for the worker's life
        # Its own cgroup, joined before anything is exec'd: every process it ever starts is in it.
        self.cgroup = Cgroup.make()
        # Forked only where its processes are found without its parentage (the cgroup: a forked
        # worker is not bubblewrap's descendant); descriptors to inherit by number (tests) come
        # only through a spawn.
        forked = (full and os.geteuid() == 0 and config.fork_workers and self.cgroup is not None
                  and not inherit_fds and device == Device.CPU)
        self._timing = False  # from the timing pool on, strays are ended around every exchange
        self.last_exchange_ns = 0  # the last command's send to its answer, by the judge's clock
        self.strays_ended = 0
        self.stray_check_ns = 0  # spent on `end_strays` (the census around every exchange), by the judge's clock
        # Spot checks: outputs handed over, and those that are not what their call committed to
        self._commits: list[int] = []
        self.spot_outputs = 0
        self.uncommitted_outputs = 0

        def start(hold: bool) -> subprocess.Popen[bytes]:
            # A forked worker's channel goes to it through the zygote: the holder must not keep
            # its pipes open (the judge sees a worker's death as the end of its answer pipe).
            program = ["sleep", "infinity"] if hold else [sys.executable, "-m", "kernelrl.judge.harness.worker",
                                                          str(p2c_r), str(c2p_w), str(self.arena.fd),
                                                          str(self.arena.capacity)]
            argv = [*prefix, *program]
            if self.cgroup is not None:
                argv = self.cgroup.join_argv(argv)
            own = () if hold else (p2c_r, c2p_w, self.arena.fd, *inherit_fds)
            fds = (*own, *([seccomp_fd] if seccomp_fd is not None else []))
            return subprocess.Popen(argv, pass_fds=fds, cwd=self.workdir, env=env,
                                    stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True)

        try:
            if forked:  # else, or where the zygote cannot, spawned
                holder = spawn(lambda: start(True))
                self._joined = fork_into(holder, env, uid=self.uid, cgroup=self.cgroup, arena=self.arena,
                                         fds=(p2c_r, c2p_w, self.arena.fd, self._log.fileno()))
                if self._joined is not None:
                    self.proc, self._status_r = holder, self._joined.status_r
                else:
                    forked = False
                if not forked and seccomp_fd is not None:
                    os.lseek(seccomp_fd, 0, os.SEEK_SET)  # read by the holder's bubblewrap; again for the next
            if not forked:
                # bwrap dies with the thread that started it: the judge's long-lived one starts it.
                self.proc = spawn(lambda: start(False)) if full else start(False)
        except BaseException:
            if self.uid is not None and full and os.geteuid() == 0:
                release_uid(self.uid)
            if self.cgroup is not None:
                self.cgroup.remove()
            raise
        finally:
            for fd in (p2c_r, c2p_w, *([seccomp_fd] if seccomp_fd is not None else [])):
                os.close(fd)
        self.channel = Channel(c2p_r, p2c_w, self.arena)
        self._apply_limits()
        self.started = time.monotonic()

    def size_arena(self, need: int) -> None:
        """The arena's size for good (`kernelrl.judge.harness.channel.arena_need` of the task's messages): set
        before the worker is given its program, so a program cannot pin more memory through it."""
        if self.arena.sealed:
            raise RuntimeError("the worker's arena is already sized")
        self._arena_need = need

    @property
    def forked(self) -> bool:
        """Whether the worker is a fork of a zygote (`SandboxConfig.fork_workers`), not spawned."""
        return self._joined is not None

    @property
    def isolated(self) -> bool:
        """Whether the worker has its own PID namespace (a private /proc)."""
        return self.containment is not Containment.NONE

    def wait_ready(self, *, deadline: float | None = None) -> Hello:
        """The worker's hello (interpreter up, torch imported); WorkerDied if it never comes.

        On hello, before the worker can be given any program, the judge finds the interpreter's
        process, sets its limits and notes its scratch's file system.
        """
        if self.hello is None:
            answer = self._receive(deadline)
            if answer.kind is not Kind.HELLO:
                raise ChannelProtocolError(f"expected hello, got {answer.kind.value}")
            self.hello = answer.header
            self._settle(self.hello.pid)
        return self.hello

    def _settle(self, pid_in_namespace: int) -> None:
        if self.containment is not Containment.NONE:
            inner, self._ns_init = find_in_namespace(self.proc.pid, pid_in_namespace)
            if self._joined is not None:  # not bubblewrap's descendant: known from the zygote
                inner = self._joined.pid if ns_pid(self._joined.pid) == pid_in_namespace else None
            if inner is None:
                raise self._died("the worker's interpreter is not among its sandbox's processes")
            self._inner_pid = inner
            self._pidfd = pidfd(inner)
            if self._ns_init is not None:
                self._init_fd = pidfd(self._ns_init)
        if self.containment is Containment.FULL:
            # Read back from the kernel, not taken on the worker's word.
            if process_limit(self.pid) != self.config.process_limit:
                raise self._died("the worker's process limit is not in force")
            try:
                self._scratch_dev = os.stat(f"/proc/{self.pid}/root{SCRATCH}").st_dev
            except OSError:
                self._scratch_dev = None  # no build reaches the cache from this worker

    def scratch(self) -> Scratch | None:
        """The judge's view of this worker's scratch (FULL containment, worker alive); None otherwise."""
        if self.containment is not Containment.FULL or self._scratch_dev is None or self.uid is None:
            return None
        return Scratch.open(self.pid, pid_fd=self._pidfd, dev=self._scratch_dev, uid=self.uid)

    def _apply_limits(self) -> None:
        """Core dumps and address space on the first process, at once (best effort: the worker sets
        every limit on itself before it says hello, `LIMITS_ENV`)."""
        pid = self._joined.pid if self._joined is not None else self.proc.pid
        try:
            resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
            if self.config.memory_limit_gib is not None and self.device == "cpu":
                cap = int(self.config.memory_limit_gib * (1 << 30))
                resource.prlimit(pid, resource.RLIMIT_AS, (cap, cap))
        except (ProcessLookupError, PermissionError, OSError):
            pass  # the worker already died; the first request reports it

    def limits(self) -> dict[str, int]:
        """The limits the worker sets on itself before it says hello (resource name -> value)."""
        cfg = self.config
        out = {"core": 0, "nofile": cfg.max_open_files, "fsize": cfg.max_file_mib << 20}
        if cfg.memory_limit_gib is not None and self.device == "cpu":
            out["as"] = int(cfg.memory_limit_gib * (1 << 30))
        if self.containment is Containment.FULL:
            out["nproc"] = cfg.process_limit  # counted for the worker's own uid (or user namespace)
        return out

    @property
    def pid(self) -> int:
        """The interpreter's pid as the judge sees it (found among the sandbox's processes on hello)."""
        return self._inner_pid if self._inner_pid is not None else self.proc.pid

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
        if not self.arena.sealed:
            self.arena.seal(self._arena_need or DEFAULT_ARENA_BYTES)
        if kind is Kind.POOL:
            self._timing = True
        if self._timing:
            self.end_strays()
        t0 = time.perf_counter_ns()  # the exchange alone: the stray census is the judge's work, and noisy
        try:
            self.channel.send(kind.value, encode(kind, header), payload)
        except (BrokenPipeError, OSError) as e:
            raise self._died(f"worker stopped accepting commands ({e})") from e
        try:
            answer = self._receive(deadline)
            self.last_exchange_ns = time.perf_counter_ns() - t0
        finally:
            if self._timing:
                self.end_strays()
        if answer.kind is not ANSWERS.get(kind) and answer.kind is not Kind.ERROR:
            raise ChannelProtocolError(f"{kind.value} answered with {answer.kind.value}")
        if answer.kind is Kind.CALLED:
            self._commits = list(answer.header.commits)
        elif answer.kind is Kind.OUTPUT_DATA and isinstance(header, Output):
            committed = self._commits[header.call] if 0 <= header.call < len(self._commits) else None
            payload = answer.payload if isinstance(answer.payload, dict) else {}
            self.spot_outputs += 1
            self.uncommitted_outputs += committed is None or commitment(payload.get("output")) != committed
        return answer

    def _receive(self, deadline: float | None) -> Answer:
        try:
            msg = self.channel.recv(deadline)
        except ChannelClosed as e:
            raise self._died("worker exited without answering") from e
        kind, header = decode(msg.kind, msg.header)
        if isinstance(header, Error):  # shown in a verdict: nothing of the judge's machine in it
            header = dataclasses.replace(header, message=redact(header.message), traceback=redact(header.traceback))
        return Answer(kind=kind, header=header, payload=msg.payload)

    def _died(self, what: str) -> WorkerDied:
        rc: int | None
        if self._status_r is not None:  # written once: kept for a second report of the same death
            rc = self._exit = self._exit if self._exit is not None else read_status(self._status_r, 5.0)
        else:
            try:
                rc = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                rc = None
        bwrap = self._status_r is None and self.containment is Containment.FULL
        if rc is not None and bwrap and rc > 128 and rc - 128 in _SIGNALS:
            rc = 128 - rc  # bubblewrap exits 128 + N when its program was killed by signal N
        if rc is not None and rc < 0:
            try:
                sig = signal.Signals(-rc).name
            except ValueError:
                sig = f"signal {-rc}"
            reason = f"{what}: killed by {sig}"
        elif rc is not None:
            reason = f"{what}: exit status {rc}"
        else:
            reason = what
        return WorkerDied(reason, role=self.role, returncode=rc, log_tail=self.log_tail())

    def log_tail(self) -> str:
        with contextlib.suppress(OSError, ValueError):  # a killed worker's log is closed; its file stays
            self._log.flush()
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return redact(data[-self.config.log_tail_chars:].decode(errors="replace"))

    # -- facts the worker cannot forge --------------------------------------------------------

    def processes(self) -> list[int]:
        """Every live process of the worker, whatever its parentage (its cgroup, else its sandbox's tree)."""
        if self.cgroup is not None:
            return self.cgroup.pids()
        return sandbox_processes(self.proc.pid)

    def strays(self) -> list[int]:
        """The worker's processes other than its interpreter, bubblewrap's own and a forked worker's
        holder and keeper (a build's compiler while it runs; a helper a program started, wherever
        it was reparented)."""
        own = {self.proc.pid, self._ns_init, self.pid}
        if self._joined is not None:
            own |= {self._joined.holder, self._joined.keeper}
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

    def child_count(self) -> int:
        """Live processes of the worker besides its interpreter (`strays`): a build's compiler counts
        while it runs, and so does a helper wherever it was reparented."""
        return len(self.strays())

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

    def kill(self) -> None:
        """End the worker and everything it started; wait until they are gone (10 s at most)."""
        if self.cgroup is not None:
            self.cgroup.kill()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self._ns_init is not None and self._init_fd is not None and not exited(self._init_fd):
            # The first process of the PID namespace: the kernel ends every other one with it,
            # whatever session or process group they moved to. (Only while its pidfd says it
            # lives: a pid that ended may name another process now.)
            try:
                os.kill(self._ns_init, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        # The namespace's first process exits only once every process in it has.
        exited(self._init_fd, 10.0)
        if self._status_r is not None:  # the keeper, unless killed with the cgroup, ends once it wrote
            read_status(self._status_r, 10.0)
        for fd in (self._init_fd, self._pidfd, self._status_r):
            if fd is not None:
                os.close(fd)
        self._init_fd = self._pidfd = self._ns_init = self._status_r = None
        if self.uid is not None and self.containment is Containment.FULL and os.geteuid() == 0:
            release_uid(self.uid)
            self.uid = None
        if self.cgroup is not None:
            self.cgroup.remove()
        self.channel.close()
        self.arena.close()
        with contextlib.suppress(OSError):
            self._log.close()

    def close(self, *, keep_dir: bool = False) -> None:
        """Ask the worker to exit, then make sure the whole group is gone and clean up."""
        if self.proc.poll() is None:
            try:
                self.channel.send(Kind.EXIT.value, {})
                if self._status_r is not None:  # bubblewrap holds a `sleep`: the worker's exit is the keeper's word
                    read_status(self._status_r, 2.0)
                else:
                    self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        if not keep_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)
