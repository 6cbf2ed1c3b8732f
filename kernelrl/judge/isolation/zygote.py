"""Worker starts without `import torch`: a fork of an interpreter that has torch already, joined to
a fresh bubblewrap sandbox (~60 ms against ~1.8 s for a spawned worker; benchmarks/README.md).

A `Zygote` is a fresh interpreter (`python -m kernelrl.judge.isolation.zygote`), started by the judge with a
worker's environment and nothing of the judge's memory, that imports the worker module (torch with
it) once and then, for each request, forks a keeper that joins the namespaces of a sandbox the
judge has just made with bubblewrap (its usual command line, holding a `sleep`): the worker's
cgroup, then IPC, network, UTS, PID and mount namespaces. The keeper forks the worker into the
PID namespace and waits for it; the worker makes itself what a spawned worker is before any program
reaches it: its own session, stdout and stderr to its log, no capability (bounding set emptied,
then the worker's uid), no_new_privs, the judge's seccomp program, no descriptor but its
channel's; then it runs `kernelrl.judge.harness.worker.main`, which sets its limits and says hello as a
spawned one does. Used by `kernelrl.judge.isolation.sandbox` under FULL containment as root, on CPU, where
each worker has a cgroup (`SandboxConfig.fork_workers`).

Guarantees:
- the zygote never holds the judge's secrets: it is spawned, not forked, with the environment a
  worker gets (`sandbox.worker_env`), and is told only descriptors, a uid and a cgroup;
- a joined worker sees the file system, processes and network of its own sandbox only, as a
  spawned one does (bubblewrap made them; nothing here mounts or unshares); it checks its own
  capabilities, no_new_privs and seccomp mode before running anything;
- it runs no program until every step above succeeded; a step that fails ends it (exit 126,
  the reason in its log) and the request reports the failure;
- its exit status reaches the judge: the keeper (its parent, outside the sandbox's PID namespace,
  so nothing in the sandbox can name it) writes it to the status pipe (`read_status`);
- the zygote is single-threaded when it forks (it checks, and refuses otherwise), reaps what
  ends at once, and ends with the judge; one per distinct worker environment, for the judge's
  life (`zygote_for`; started again if it died).

Does not guarantee: a fresh address-space layout per worker (every fork of one zygote shares its
layout and Python's hash seed), nor anything on a GPU (the judge spawns CUDA workers).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from kernelrl.judge.harness.channel import Arena
from kernelrl.judge.harness.places import SCRATCH
from kernelrl.judge.isolation.cgroup import Cgroup
from kernelrl.judge.isolation.containment import find_in_namespace, spawn

# CLONE_NEW* flags of the namespaces a worker joins, the mount namespace last (it moves the root).
_JOIN = (("cgroup", 0x02000000), ("ipc", 0x08000000), ("net", 0x40000000), ("uts", 0x04000000),
         ("pid", 0x20000000), ("mnt", 0x00020000))
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 24, 38, 22, 2
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER, _PR_SET_DUMPABLE = 1, 36, 4
_CAP_LAST = 63
JOIN_FAILED = 126  # a joined process's exit status when a step before the program failed
_ANSWER_S = 60.0  # the zygote's start (torch's import) and each request, at most
# What torch.compile imports on first use (`_preload`); the rest of inductor comes with these.
_PRELOAD = ("torch._dynamo", "torch._inductor.compile_fx", "torch._dynamo.repro.after_dynamo",
            "torch._inductor.compiler_bisector")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


@dataclass(frozen=True, kw_only=True)
class Request:
    """One worker: the host pid of a process inside its sandbox, its uid, its cgroup's
    `cgroup.procs` (or None) and its channel (the worker's argv: command pipe, answer pipe, arena,
    arena capacity). Descriptors travel beside it, in this order: the three channel ones, the log,
    the status pipe's write end."""

    holder: int
    uid: int
    cgroup_procs: str | None
    arena_capacity: int


class ZygoteError(RuntimeError):
    """The zygote could not start a worker (it died, or a step of the join failed)."""


class Zygote:
    """The judge's side: one zygote process, requests one at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        self._lock = threading.Lock()
        # Its parent-death signal follows the thread that started it: the judge's long-lived one.
        # PWD: what bubblewrap sets for the program it starts in the scratch, where workers start.
        # No stdio of the judge's: a keeper outliving a killed judge must not hold its output open.
        self.proc = spawn(lambda: subprocess.Popen(
            [sys.executable, "-m", "kernelrl.judge.isolation.zygote", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
            env={**env, "PWD": SCRATCH}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True))
        theirs.close()
        self._sock.settimeout(_ANSWER_S)
        try:
            hello = self._sock.recv(4096)
        except OSError as e:
            hello = repr(e).encode()
        if hello != b"ready":
            self.proc.kill()
            self.close()
            raise ZygoteError(f"the zygote did not start ({hello!r})")

    def start(self, req: Request, fds: tuple[int, int, int, int, int]) -> tuple[int, int]:
        """Fork a worker into `req.holder`'s sandbox: its host pid and its keeper's (see `_join`)."""
        with self._lock:
            if self.proc.poll() is not None:
                raise ZygoteError("the zygote is not running")
            try:
                socket.send_fds(self._sock, [json.dumps(req.__dict__).encode()], list(fds))
                answer = json.loads(self._sock.recv(4096) or b"{}")
            except OSError as e:  # a late answer would be the next request's: this zygote is done
                self.proc.kill()
                raise ZygoteError(f"the zygote did not answer: {e!r}") from e
        if "pid" not in answer:
            raise ZygoteError(answer.get("error", "the zygote closed its socket"))
        return int(answer["pid"]), int(answer["keeper"])

    def close(self) -> None:
        self._sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_zygotes: dict[tuple[tuple[str, str], ...], Zygote] = {}
_zygotes_lock = threading.Lock()


def zygote_for(env: dict[str, str]) -> Zygote:
    """The zygote for workers of this environment, started on first use (and again if it died)."""
    key = tuple(sorted(env.items()))
    with _zygotes_lock:
        z = _zygotes.get(key)
        if z is None or z.proc.poll() is not None:
            z = _zygotes[key] = Zygote(env)
        return z


@dataclass(frozen=True)
class Joined:
    """A forked worker, by host pid: the sandbox's holder, the worker, and its keeper (its parent,
    which writes the worker's exit status to `status_r`, the judge's end, once it has exited)."""

    holder: int
    pid: int
    keeper: int
    status_r: int


def fork_into(proc: subprocess.Popen[bytes], env: dict[str, str], *, uid: int | None, cgroup: Cgroup | None,
              arena: Arena, fds: tuple[int, int, int, int]) -> Joined | None:
    """Start a worker in the sandbox `proc` (bubblewrap running `sleep`) through the zygote of
    `env`. `fds`: the command pipe's read end, the answer pipe's write end, the arena and the log.
    The worker is not a descendant of `proc`: the judge knows its pid from here, not from the
    tree, and its exit status from the status pipe. None where the zygote could not (it died, or
    torch left it a second thread): said in the log, the sandbox ended, for the caller to spawn."""
    status_r, status_w = os.pipe()
    try:
        holder, pid, keeper = _join_holder(proc, env, uid=uid, cgroup=cgroup, arena=arena, fds=(*fds, status_w))
        return Joined(holder, pid, keeper, status_r)
    except ZygoteError as e:
        os.write(fds[3], f"kernelrl: not forked, spawned instead: {e}\n".encode())
        if cgroup is not None:
            cgroup.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        os.close(status_r)
        return None
    finally:
        os.close(status_w)


def _join_holder(proc: subprocess.Popen[bytes], env: dict[str, str], *, uid: int | None, cgroup: Cgroup | None,
                 arena: Arena, fds: tuple[int, int, int, int, int], timeout_s: float = 30.0) -> tuple[int, int, int]:
    """(the holder's, the worker's and the keeper's host pids) of a worker started in `proc`."""
    if uid is None:
        raise ZygoteError("a forked worker needs a uid of its own")
    deadline = time.monotonic() + timeout_s
    while True:
        holder, _ = find_in_namespace(proc.pid, 2)
        try:
            if holder is not None and Path(f"/proc/{holder}/comm").read_text().strip() == "sleep":
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise ZygoteError("the sandbox did not start its holder")
        time.sleep(0.002)
    pid, keeper = zygote_for(env).start(Request(holder=holder, uid=uid, arena_capacity=arena.capacity,
                                                cgroup_procs=str(cgroup.path / "cgroup.procs") if cgroup else None), fds)
    return holder, pid, keeper


def read_status(fd: int, timeout_s: float) -> int | None:
    """The worker's exit code as `subprocess` gives it (negative: killed by that signal), read from
    the status pipe within `timeout_s`; None if its keeper has not written it (or died first)."""
    if not select.select([fd], [], [], timeout_s)[0]:
        return None
    try:
        said = os.read(fd, 64).decode().strip()
    except OSError:
        return None
    return int(said) if said.lstrip("-").isdigit() else None


# -- inside the zygote ------------------------------------------------------------------------


def _join(req: Request, fds: list[int], report: int) -> None:
    """The keeper: join the sandbox, fork the worker into its PID namespace, write the worker's host
    pid to `report`, then wait for the worker and write its exit code to the status pipe.

    The keeper stays outside the sandbox's PID namespace (setns changes only its children's), so
    nothing in the sandbox can name it; it holds no descriptor but the status pipe while it waits."""
    libc = ctypes.CDLL(None, use_errno=True)
    if req.cgroup_procs is not None:
        Path(req.cgroup_procs).write_text("0")
    for name, flag in _JOIN:
        fd = os.open(f"/proc/{req.holder}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.setns(fd, flag) != 0:
                raise OSError(ctypes.get_errno(), f"setns {name}")
        finally:
            os.close(fd)
    pid = os.fork()
    if pid:
        status_w = fds[4]
        os.write(report, str(pid).encode())
        # Its /proc is the sandbox's now, where it has no entry: every other descriptor by range.
        os.closerange(3, status_w)
        os.closerange(status_w + 1, os.sysconf("SC_OPEN_MAX"))
        _, status = os.waitpid(pid, 0)
        with contextlib.suppress(OSError):
            os.write(status_w, str(os.waitstatus_to_exitcode(status)).encode())
        os._exit(0)
    os.close(report)
    os.close(fds[4])
    _become_worker(libc, req, fds[:4])


def _become_worker(libc: ctypes.CDLL, req: Request, fds: list[int]) -> None:
    p2c_r, c2p_w, arena_fd, log_fd = fds
    try:
        os.setsid()
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        null = os.open("/dev/null", os.O_RDONLY)  # the sandbox's own, now that its mounts are ours
        os.dup2(null, 0)
        keep = {0, 1, 2, p2c_r, c2p_w, arena_fd}
        for fd in [int(f) for f in os.listdir("/proc/self/fd")]:
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        from kernelrl.judge.harness.places import SCRATCH
        from kernelrl.judge.isolation.seccomp import program

        os.chdir(SCRATCH)
        for cap in range(_CAP_LAST + 1):
            libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last capability
        os.setgroups([])
        os.setresgid(req.uid, req.uid, req.uid)
        os.setresuid(req.uid, req.uid, req.uid)  # root to a plain uid: every capability goes
        # A change of uid made the process undumpable (its /proc root's); a spawned worker is
        # dumpable again after its exec. Core dumps stay off (its limits), ptrace is refused (seccomp).
        libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "no_new_privs")
        code = program()
        if code is None:
            raise OSError("no seccomp program for this architecture")
        buf = ctypes.create_string_buffer(code, len(code))
        fprog = _SockFprog(len(code) // 8, ctypes.addressof(buf))  # 8 bytes an instruction
        if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "seccomp")
        status = Path("/proc/self/status").read_text()
        if not all(f"{k}:\t{v}\n" in status for k, v in (("CapEff", "0000000000000000"), ("CapBnd", "0000000000000000"),
                                                         ("NoNewPrivs", "1"), ("Seccomp", "2"))):
            raise OSError("capabilities, no_new_privs or seccomp not as required")
    except BaseException as e:  # noqa: BLE001 - no program runs; the judge sees the exit and the log
        os.write(2, f"kernelrl: the worker could not join its sandbox: {e!r}\n".encode())
        os._exit(JOIN_FAILED)
    from kernelrl.judge.harness import worker

    argv = ["kernelrl.judge.harness.worker", str(p2c_r), str(c2p_w), str(arena_fd), str(req.arena_capacity)]
    sys.argv = argv
    sys.modules["__main__"] = worker  # as in a spawned worker (`python -m kernelrl.judge.harness.worker`)
    try:
        exit_code = worker.main(argv)
    except SystemExit as e:  # as an interpreter ends on it
        exit_code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    except BaseException:  # noqa: BLE001 - never back into the zygote's loop: printed, status 1
        traceback.print_exc()
        exit_code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def _reap() -> None:
    """Collect every adopted worker that has ended."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _preload() -> None:
    """torch.compile's own modules, imported once here rather than in every worker that compiles.

    A worker's first `torch.compile` imports dynamo and inductor (~2 s of CPU on a 2-core machine,
    benchmarks/README.md); a fork inherits them. Imports only: nothing is compiled, no cache is
    read or written (a worker's cache folders are set after its fork and read when it compiles), and
    these modules start no thread (the loop refuses to fork otherwise, and the judge then spawns).
    After `ready`, so the judge is not held while it runs; the first request waits for it. A
    failed import leaves the worker to import what it needs, as a spawned one does."""
    # Inductor imports Triton where it is installed, and `triton.jit` decides when it decorates
    # whether a function is interpreted: triton.language's own (`tl.sigmoid`, ...) are decorated at
    # that import, so it runs with the interpreter on, as every CPU program worker has it before its
    # program is imported (`harness.toolchain.configure_triton`); then the environment as it was.
    interpret = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        for name in _PRELOAD:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001, S112 - an optimisation only: torch without inductor, say
                continue
    finally:
        if interpret is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = interpret


def serve(sock: socket.socket) -> None:
    """The zygote's loop: one request at a time until the judge closes its end."""
    libc = ctypes.CDLL(None)
    libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # ends with the judge
    # Workers outlive the process that forked them into their PID namespace; as a subreaper the
    # zygote adopts them (else the host's init would, which in a container may never reap).
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # Reaped as soon as they end: a PID namespace's first process exits only once every process
    # in it was reaped, and the judge waits for that when it ends a worker.
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    # Torch, through the worker module, as a spawned worker imports it: transparent huge pages
    # are off first (`kernelrl.judge.harness.startup`), and forks keep that setting.
    import kernelrl.judge.harness.worker  # noqa: F401 - the point of the zygote

    sock.send(b"ready")
    _preload()
    while True:
        _reap()
        try:
            ready = select.select([sock.fileno(), wake_r], [], [])[0]
        except InterruptedError:
            continue
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        if sock.fileno() not in ready:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 4096, 5)
        except OSError:
            return
        if not msg:
            return
        try:
            req = Request(**json.loads(msg))
            if len(fds) != 5:
                raise ValueError(f"{len(fds)} descriptors, not 5")
            threads = len(os.listdir("/proc/self/task"))
            if threads != 1:
                raise RuntimeError(f"the zygote has {threads} threads; it forks only single-threaded")
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the keeper; whatever happens, it never returns into this loop
                try:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for fd in (r, wake_r, wake_w):
                        os.close(fd)
                    sock.close()
                    _join(req, fds, w)
                except BaseException as e:  # noqa: BLE001
                    with contextlib.suppress(OSError):
                        os.write(w, f"error {e!r}".encode())
                finally:
                    os._exit(JOIN_FAILED)
            os.close(w)
            with os.fdopen(r, "rb") as f:
                said = f.read().decode()  # to its end: the keeper closes it once the worker is forked
            if said.isdigit():
                reply: dict[str, object] = {"pid": int(said), "keeper": pid}
            else:
                _, status = os.waitpid(pid, 0)
                reply = {"error": said or f"the join ended with status {os.waitstatus_to_exitcode(status)}"}
        except Exception as e:  # noqa: BLE001 - a bad request is answered, the zygote goes on
            reply = {"error": f"{type(e).__name__}: {e}"}
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(json.dumps(reply).encode())


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
