"""The sandbox: a spawned worker process with its own interpreter, directory, limits and env.

Guarantees:
- every worker is a fresh interpreter (`python -m kernelrl.judge.worker`), never a fork of the judge,
  in its own session (process group), with its own temporary directory as cwd, HOME and TMPDIR;
- its environment is built from an allow-list (`ENV_ALLOW`) plus the variables the judge sets;
  API keys, tokens and the judge's secrets never reach it because nothing else is copied;
- address-space (CPU device only: CUDA reserves huge virtual ranges) and core-dump limits are set
  with prlimit before the worker is sent any code;
- the glibc allocator is pinned (fixed mmap and trim thresholds) so large-tensor timings do not
  swing with glibc's adaptive threshold; OpenMP threads sleep when idle, so idle CPU is a signal;
- `kill()` ends the whole process group (compiler children included) and never raises;
- where the judge runs as root and `unshare` works (`proc_isolation`), the worker runs in its own
  PID and mount namespaces with a private /proc and an empty capability bounding set: it sees
  no other process (so it cannot read the judge's or anyone's environment or memory through
  /proc) and cannot mount the real /proc back;
- the judge reads the worker's CPU time and thread count from its own /proc, which the worker
  cannot forge.

Does not guarantee isolation from the file system or the network namespace the judge runs in;
without root (no namespaces), a worker can read the /proc of processes of its own user. Run the
judge in a container for untrusted code at scale.
"""

from __future__ import annotations

import fcntl
import functools
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelrl.judge.channel import (
    Arena,
    Channel,
    ChannelClosed,
    ChannelProtocolError,
    ChannelTimeout,
)
from kernelrl.judge.protocol import ANSWERS, Header, Hello, Kind, decode, encode

# Copied from the judge's environment when present; everything else is dropped.
ENV_ALLOW = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ",
    "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH", "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
    "CC", "CXX", "TORCH_CUDA_ARCH_LIST", "TRITON_INTERPRET",
)
# glibc reads these at start-up. Every allocation comes from the heap, never from mmap, and freed
# memory stays there: a tensor of 32 MiB or more (glibc's largest mmap threshold) was otherwise
# mapped afresh, and its pages faulted in and zeroed, on every call in one process, but carved
# from free heap in another, depending on each process's history; identical code measured up to
# 1.7x apart between two processes (benchmarks/README.md, timing noise). A fixed threshold also
# turns off the adaptive one that made large-tensor timings swing up to 3x.
#
# Carved from the heap, a tensor lands wherever the process's history left free space, so the
# distance between a call's input and its output, modulo 4 KiB, differed from process to process;
# an output starting 64-256 bytes past its input (modulo 4 KiB) made loads wait on unrelated
# stores (4K aliasing): GELU on 4 MiB ran 10 % slower at 64 bytes than at 0, in one process
# (benchmarks/README.md, timing noise). Torch's THP allocation setting starts every tensor of
# 2 MiB or more on a page boundary, so every such input and output pair is 0 apart modulo 4 KiB in
# every process; the worker turns transparent huge pages off for itself (`NO_HUGE_PAGES_ENV`), so
# whether a tensor happens to span an aligned 2 MiB extent cannot make it faster either.
PINNED_ALLOCATOR_ENV = {
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
    "MALLOC_TOP_PAD_": str(64 << 20),
    "THP_MEM_ALLOC_ENABLE": "1",
}
# Read by the worker at start-up: no transparent huge pages in this process (prctl).
NO_HUGE_PAGES_ENV = "KERNELRL_NO_HUGE_PAGES"
# the folder that holds the kernelrl package (this file is kernelrl/judge/sandbox.py)
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


# Own PID and mount namespace with a fresh /proc; no capabilities, no privilege gain on exec.
_ISOLATION_PREFIX = ("unshare", "--pid", "--fork", "--mount-proc",
                     "setpriv", "--bounding-set", "-all", "--inh-caps", "-all", "--no-new-privs")


@functools.cache
def isolation_available() -> bool:
    """Whether workers can run with a private /proc here (root and working namespaces)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None:
        return False
    try:
        done = subprocess.run([*_ISOLATION_PREFIX, "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


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
    proc_isolation: bool = True  # private /proc and no capabilities, where available
    log_tail_chars: int = 4000

    def __post_init__(self) -> None:
        if self.threads < 0:
            raise ValueError("threads must be >= 0")
        if self.memory_limit_gib is not None and self.memory_limit_gib <= 0.5:
            raise ValueError("memory_limit_gib must be > 0.5 GiB (torch alone needs more) or None")

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


def _widen_pipe(fd: int) -> None:
    """A 1 MiB pipe buffer (Linux), so tensors cross in fewer, larger writes; else the default."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except OSError:
        pass


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
        # torch.compile compiles in this process, not in a pool of workers that would outlive
        # the call that started them (and look like work left running).
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        # No network for programs under test: hub libraries fail at once instead of retrying.
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    })
    if config.pin_allocator:
        env.update(PINNED_ALLOCATOR_ENV)
        env[NO_HUGE_PAGES_ENV] = "1"
    if extra:
        env.update(extra)
    return env


@dataclass(frozen=True)
class Answer:
    """A worker's typed answer to one command (`kernelrl.judge.protocol`)."""

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

    def __init__(self, *, config: SandboxConfig, device: str, device_index: int | None = None,
                 root: Path | None = None, role: str = "worker"):
        self.role = role
        self.config = config
        self.device = device
        self.workdir = Path(tempfile.mkdtemp(prefix="kernelrl-worker-", dir=root))
        self.log_path = self.workdir / "worker.log"
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        self.arena = Arena.create()
        for fd in (p2c_w, c2p_w):
            _widen_pipe(fd)
        extra = {"CUDA_VISIBLE_DEVICES": str(device_index)} if device_index is not None else None
        env = worker_env(config, self.workdir, extra)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - kept open for the worker's life
        self.isolated = config.proc_isolation and isolation_available()
        prefix = list(_ISOLATION_PREFIX) if self.isolated else []
        self._inner_pid: int | None = None
        self.hello: Hello | None = None
        try:
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", "kernelrl.judge.worker", str(p2c_r), str(c2p_w),
                 str(self.arena.fd), str(self.arena.capacity)],
                pass_fds=(p2c_r, c2p_w, self.arena.fd), cwd=self.workdir, env=env, stdin=subprocess.DEVNULL,
                stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
            )
        finally:
            os.close(p2c_r)
            os.close(c2p_w)
        self.channel = Channel(c2p_r, p2c_w, self.arena)
        self._apply_limits()
        self.started = time.monotonic()

    def wait_ready(self, *, deadline: float | None = None) -> Hello:
        """The worker's hello (interpreter up, torch imported); WorkerDied if it never comes."""
        if self.hello is None:
            answer = self._receive(deadline)
            if answer.kind is not Kind.HELLO:
                raise ChannelProtocolError(f"expected hello, got {answer.kind.value}")
            self.hello = answer.header
        return self.hello

    def ready_now(self) -> bool:
        """Whether the hello has arrived (without waiting)."""
        if self.hello is not None:
            return True
        ready, _, _ = select.select([self.channel.read_fd], [], [], 0)
        if not ready:
            return False
        try:
            self.wait_ready(deadline=time.monotonic() + 5)
        except (WorkerDied, ChannelTimeout, ChannelProtocolError):
            return False
        return True

    def _apply_limits(self) -> None:
        pid = self.proc.pid
        try:
            resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
            if self.config.memory_limit_gib is not None and self.device == "cpu":
                cap = int(self.config.memory_limit_gib * (1 << 30))
                resource.prlimit(pid, resource.RLIMIT_AS, (cap, cap))
        except (ProcessLookupError, PermissionError, OSError):
            pass  # the worker already died; the first request reports it

    @property
    def pid(self) -> int:
        """The interpreter's pid as the judge sees it (a child of `unshare` when isolated)."""
        if not self.isolated:
            return self.proc.pid
        if self._inner_pid is None:
            try:
                with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                    kids = f.read().split()
            except OSError:
                kids = []
            if not kids:
                return self.proc.pid  # not forked yet: the interpreter is not running yet either
            self._inner_pid = int(kids[0])
        return self._inner_pid

    def request(self, header: Header, payload: Any = None, *, deadline: float | None = None) -> Answer:
        """Send one command and wait for its answer (ChannelTimeout past the deadline).

        The answer must be the kind the command allows, or an error; anything else is a
        protocol violation (ChannelProtocolError).
        """
        return self._exchange(header.KIND, header, payload, deadline)

    def command(self, kind: Kind, payload: Any = None, *, deadline: float | None = None) -> Answer:
        """A command without fields (get_state, pool, call, output...)."""
        return self._exchange(kind, None, payload, deadline)

    def _exchange(self, kind: Kind, header: Header | None, payload: Any, deadline: float | None) -> Answer:
        if self.hello is None:
            self.wait_ready(deadline=deadline)
        try:
            self.channel.send(kind.value, encode(kind, header), payload)
        except (BrokenPipeError, OSError) as e:
            raise self._died(f"worker stopped accepting commands ({e})") from e
        answer = self._receive(deadline)
        if answer.kind is not ANSWERS.get(kind) and answer.kind is not Kind.ERROR:
            raise ChannelProtocolError(f"{kind.value} answered with {answer.kind.value}")
        return answer

    def _receive(self, deadline: float | None) -> Answer:
        try:
            msg = self.channel.recv(deadline)
        except ChannelClosed as e:
            raise self._died("worker exited without answering") from e
        kind, header = decode(msg.kind, msg.header)
        return Answer(kind=kind, header=header, payload=msg.payload)

    def _died(self, what: str) -> WorkerDied:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = None
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
        try:
            self._log.flush()
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-self.config.log_tail_chars:].decode(errors="replace")

    # -- facts the worker cannot forge --------------------------------------------------------

    def cpu_time_ns(self) -> int | None:
        """CPU time of all the worker's threads, from the kernel's scheduler statistics."""
        total = 0
        try:
            for tid in os.listdir(f"/proc/{self.pid}/task"):
                try:
                    with open(f"/proc/{self.pid}/task/{tid}/schedstat") as f:
                        total += int(f.read().split()[0])
                except (FileNotFoundError, ProcessLookupError):
                    continue  # a thread ended while we read
        except (FileNotFoundError, ProcessLookupError):
            return None
        return total

    def child_count(self) -> int:
        """Live child processes of the worker (a build's compiler counts while it runs)."""
        n = 0
        try:
            for tid in os.listdir(f"/proc/{self.pid}/task"):
                try:
                    with open(f"/proc/{self.pid}/task/{tid}/children") as f:
                        n += len(f.read().split())
                except OSError:
                    continue
        except OSError:
            return 0
        return n

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
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.channel.close()
        self.arena.close()
        try:
            self._log.close()
        except OSError:
            pass

    def close(self, *, keep_dir: bool = False) -> None:
        """Ask the worker to exit, then make sure the whole group is gone and clean up."""
        if self.proc.poll() is None:
            try:
                self.channel.send(Kind.EXIT.value, {})
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        if not keep_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)
