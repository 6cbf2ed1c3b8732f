"""Containment: what a worker can reach of the judge's machine, and the judge's safe view of its scratch.

Three levels (`kernelrl.result.Containment`); a worker gets the best one that works here, no
better than `SandboxConfig.containment`, and every result records it:

- FULL, through bubblewrap (`bwrap` on PATH: Debian's `bubblewrap` package):
  - an unprivileged uid and gid of its own (drawn per worker from `SandboxConfig.uids` when the
    judge is root, so no two live workers share a process count), no capabilities, no_new_privs;
  - a read-only view of the system (/usr, /etc, /opt, /sys and the /bin, /lib links), of the
    Python environment (its prefixes and site-packages) and of the kernelrl package folder alone;
    nothing else of the machine exists in its file system: no home folder, no cache folder (build
    cache, databases, peaks), no run folder, no token file;
  - a private scratch: /tmp is a size-limited tmpfs (`scratch_mib`) that is its cwd, HOME and
    TMPDIR, /var/tmp points into it, /dev/shm is a second one; both end with the worker;
  - its own network (loopback only), PID, IPC, UTS and cgroup namespaces, and no way to make
    more or to mount anything: a seccomp filter (`kernelrl.judge.isolation.seccomp`) refuses unshare, setns,
    clone with a CLONE_NEW* flag, every mount call, keyctl, bpf, perf_event_open, ptrace and the
    like; the probe checks from inside a contained process that a user namespace is refused, and
    FULL is not claimed where the filter cannot be built or does not hold;
  - limits on processes (`max_processes`, counted for its uid alone), open files and file size,
    set on the interpreter before it is given any program;
  - no process outlives it: it is the first process of its PID namespace's only child, and
    `--die-with-parent` kills the namespace when the judge's spawning thread ends
    (`spawn` keeps one thread alive for that, since PR_SET_PDEATHSIG follows the thread);
  - on a GPU, the /dev/nvidia* device nodes pass through, and the probe starts CUDA in a contained
    interpreter (a one-element tensor on the device): a sandbox that hides the GPU is not FULL,
    and the reason says CUDA could not start there; on a CPU that step is skipped;
  - builds and compiler caches (torch extensions, Triton, inductor) live in its scratch
    (`BUILD_DIR_ENV`, `CACHE_ROOT_ENV`); the judge copies a finished build out and a cached one
    in through `Scratch` (`kernelrl.judge.isolation.builds` checks what it copies).
- NAMESPACES (root only, `unshare` + `setpriv`): own PID and mount namespaces with a private /proc
  and no capabilities; the judge's files and network are shared.
- NONE: a plain child process.

Where the judge runs as root, bwrap runs privileged without a user namespace and `setpriv` drops to
the worker's uid inside: a user namespace made by root maps the sandbox's user to root outside,
and root's files stay writable and readable by it (a 0600 token file included). Where the judge
is an ordinary user, bwrap makes a user namespace (further ones disabled) and the worker keeps
that user's uid, which owns none of the files it can see.

Does not guarantee: protection from kernel bugs (namespaces are the kernel's), limits on CPU time,
memory beyond `memory_limit_gib` (tmpfs pages count against the machine, bounded by
`scratch_mib`), or that the system folders hold no secrets readable by any user.
"""

from __future__ import annotations

import fcntl
import functools
import os
import platform
import re
import secrets
import select
import shutil
import stat
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kernelrl.judge.harness.device import Device
from kernelrl.judge.harness.places import SCRATCH
from kernelrl.judge.harness.procfs import descendants
from kernelrl.judge.isolation import seccomp
from kernelrl.result import Containment

# Ordered from least to most: a pool reports the weakest level it gives.
ORDER = (Containment.NONE, Containment.NAMESPACES, Containment.FULL)

# The system, read-only. Top-level links (merged /usr: /bin -> usr/bin) are made as links.
SYSTEM_PATHS = ("/usr", "/etc", "/opt", "/sys", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Own PID and mount namespace with a fresh /proc; no capabilities, no privilege gain on exec.
NAMESPACES_PREFIX = ("unshare", "--pid", "--fork", "--mount-proc",
                     "setpriv", "--bounding-set", "-all", "--inh-caps", "-all", "--no-new-privs")
_PACKAGE_DIR = str(Path(__file__).resolve().parents[2])  # .../kernelrl


def rank(level: Containment) -> int:
    return ORDER.index(level)


@dataclass(frozen=True)
class Probe:
    """The level workers get here, and why it is not more."""

    level: Containment
    reason: str = ""


# -- what a fully contained worker sees -------------------------------------------------------


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def python_paths() -> list[str]:
    """The Python environment, as folders: prefixes, site-packages and the interpreter's folder."""
    found = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
             os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable))]
    found += [sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    out: list[str] = []
    for p in found:
        for q in (os.path.abspath(p), os.path.realpath(p)) if p else ():
            if os.path.isdir(q) and q not in out:
                out.append(q)
    return out


def readonly_paths(extra: tuple[str, ...] = ()) -> list[str]:
    """Every folder bound read-only into a fully contained worker, outermost first, none inside another.

    The system folders that exist (links excepted), the Python environment, the kernelrl package
    folder (never the checkout around it: run folders and token files live there), CUDA_HOME when
    set, and `extra`. Raises ValueError for a folder that would show the judge's home or `/`.
    """
    system = [p for p in SYSTEM_PATHS if os.path.isdir(p) and not os.path.islink(p)]
    wanted = [*system, *python_paths(), _PACKAGE_DIR, os.path.realpath(_PACKAGE_DIR)]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var) and os.path.isdir(os.environ[var]):
            wanted.append(os.path.realpath(os.environ[var]))
    wanted += [os.path.abspath(p) for p in extra]
    home = os.path.realpath(os.path.expanduser("~"))
    out: list[str] = []
    for p in sorted(set(wanted), key=len):
        if p == "/" or _under(home, [p]):
            raise ValueError(f"{p} holds the judge's home folder ({home}): it cannot be shown to a worker")
        if not _under(p, out):
            out.append(p)
    return out


def device_nodes(device: Device, minor: int | None = None) -> list[str]:
    """The device nodes a worker on `device` needs beyond bwrap's minimal /dev (NVIDIA's, on cuda):
    with `minor`, of the per-GPU nodes (/dev/nvidiaN) only that GPU's."""
    if device != "cuda" or not os.path.isdir("/dev"):
        return []
    nodes = sorted(os.path.join("/dev", n) for n in os.listdir("/dev") if n.startswith("nvidia"))
    if minor is not None:
        nodes = [n for n in nodes if not re.fullmatch(r"/dev/nvidia\d+", n) or n == f"/dev/nvidia{minor}"]
    return [n for n in nodes if os.path.exists(n)]


def bwrap_prefix(*, bwrap: str, uid: int, device: Device, scratch_bytes: int, as_root: bool,
                 extra: tuple[str, ...] = (), setpriv: str = "setpriv", seccomp_fd: int | None = None,
                 gpu_minor: int | None = None) -> list[str]:
    """The command line that runs a program fully contained (the program's own argv follows it).

    `seccomp_fd`: a descriptor holding `kernelrl.judge.isolation.seccomp.program()`, passed to bwrap (read once).
    """
    argv = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    if as_root:
        # Privileged bwrap, no user namespace; setpriv needs these three to drop to the worker's uid.
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    else:
        argv += ["--unshare-user", "--disable-userns"]
    for p in SYSTEM_PATHS:
        if os.path.islink(p):
            argv += ["--symlink", os.readlink(p), p]
    made: set[str] = set()
    paths = readonly_paths(extra)
    # A path under the scratch folder (a checkout in /tmp) is bound after the scratch tmpfs is
    # mounted there, or the tmpfs would hide it.
    later = [p for p in paths if _under(p, [SCRATCH])]

    def bind(p: str) -> list[str]:
        out: list[str] = []
        # bwrap makes missing parents 0700 (root's): the worker could not walk through them.
        for parent in reversed(Path(p).parents):
            q = str(parent)
            if q not in ("/", SCRATCH) and q not in made and not _under(q, ["/" + s.strip("/") for s in SYSTEM_PATHS]):
                out += ["--perms", "0755", "--dir", q]
                made.add(q)
        return [*out, "--ro-bind", p, p]

    for p in paths:
        if p not in later:
            argv += bind(p)
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for node in device_nodes(device, gpu_minor):
        argv += ["--dev-bind", node, node]
    argv += ["--perms", "1777", "--size", str(scratch_bytes), "--tmpfs", SCRATCH,
             "--perms", "1777", "--size", str(scratch_bytes), "--tmpfs", "/dev/shm",
             "--perms", "0755", "--dir", "/var", "--symlink", "../tmp", "/var/tmp"]
    for p in later:
        argv += bind(p)
    argv += ["--chdir", SCRATCH]
    if as_root:
        return [*argv, "--", setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--no-new-privs", "--"]
    return [*argv, "--"]


# -- which level works here -------------------------------------------------------------------


@functools.cache
def namespaces_available() -> bool:
    """Whether workers can run with a private /proc here (root and working namespaces)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None:
        return False
    try:
        done = subprocess.run([*NAMESPACES_PREFIX, "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


# Run inside a contained interpreter by the probe: kernelrl imports, and neither a user namespace
# nor a mount can be made (exit status _PROBE_NAMESPACE_MADE otherwise).
_PROBE_NAMESPACE_MADE = 97
_PROBE = ("import ctypes, kernelrl\n"
          "libc = ctypes.CDLL(None, use_errno=True)\n"
          f"made = libc.unshare({0x10000000}) == 0 or libc.mount(b'none', b'{SCRATCH}', b'tmpfs', 0, None) == 0\n"
          f"if made: raise SystemExit({_PROBE_NAMESPACE_MADE})\n")
# Then, on a GPU: CUDA starts there (exit status _PROBE_NO_CUDA and the error's last line otherwise).
_PROBE_NO_CUDA = 98
_PROBE_CUDA = ("import sys\n"
               "try:\n"
               "    import torch\n"
               "    torch.zeros(1, device='cuda')\n"
               "except Exception as e:\n"
               "    print(f'{type(e).__name__}: {e}'.splitlines()[0], file=sys.stderr)\n"
               f"    raise SystemExit({_PROBE_NO_CUDA})\n")
# What a contained interpreter is given of the judge's environment for CUDA (the worker's allow-list has them too).
_CUDA_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME")


def probe_script(device: Device) -> tuple[str, ...]:
    """The interpreter's flags and program for the probe: without site-packages on a CPU; on a GPU
    with them (torch), and starting CUDA."""
    if device == Device.CUDA:
        return ("-s", "-c", _PROBE + _PROBE_CUDA)
    return ("-S", "-c", _PROBE)


def probe_failure(returncode: int, stderr: str, device: Device) -> str:
    """Why a contained interpreter's probe failed, in one line ('' when it did not)."""
    lines = stderr.strip().splitlines()
    last = lines[-1].strip() if lines else ""
    if returncode == 0:
        return ""
    if returncode == _PROBE_NAMESPACE_MADE:
        return "a contained process could make a user namespace or mount a file system (seccomp filter not in force)"
    if returncode == _PROBE_NO_CUDA and device == Device.CUDA:
        return (f"a contained process could not start CUDA ({last or 'no error given'}): the sandbox does not show "
                "the GPU (its /dev/nvidia* device nodes, or the driver's libraries)")
    return f"bwrap failed here: {last or f'exit status {returncode}'}"


@functools.cache
def _bwrap_works(bwrap: str, executable: str, euid: int, probe_uid: int, device: Device = Device.CPU) -> str:
    """'' when a contained interpreter starts and imports kernelrl here (and starts CUDA, on a GPU);
    else why not."""
    fd = seccomp.program_fd()
    if fd is None:
        return f"no seccomp filter for this architecture ({platform.machine()}): nested namespaces would be allowed"
    try:
        argv = bwrap_prefix(bwrap=bwrap, uid=probe_uid, device=device, scratch_bytes=16 << 20, as_root=euid == 0,
                            seccomp_fd=fd)
    except ValueError as e:
        os.close(fd)
        return str(e)
    if euid == 0 and shutil.which("setpriv") is None:
        os.close(fd)
        return "setpriv (util-linux) not found on PATH"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(Path(_PACKAGE_DIR).parent),
           "HOME": SCRATCH}
    if device == Device.CUDA:
        env.update({k: os.environ[k] for k in _CUDA_ENV if k in os.environ})
    try:
        done = subprocess.run([*argv, executable, *probe_script(device)], capture_output=True, env=env,
                              timeout=60 if device == Device.CPU else 180, stdin=subprocess.DEVNULL, pass_fds=(fd,))
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap did not run: {e}"
    finally:
        os.close(fd)
    return probe_failure(done.returncode, done.stderr.decode(errors="replace"), device)


def probe(wanted: Containment, uids: tuple[int, int], device: Device = Device.CPU) -> Probe:
    """The best level not above `wanted` that works on this machine for `device`, with the reason it is not FULL."""
    why = ""
    if rank(wanted) >= rank(Containment.FULL):
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            why = "bubblewrap (bwrap) is not on PATH (Debian: apt-get install bubblewrap)"
        else:
            why = _bwrap_works(bwrap, sys.executable, os.geteuid(), uids[0], Device(device))
            if not why:
                return Probe(Containment.FULL)
    elif wanted is not Containment.FULL:
        why = f"containment {wanted.value} was asked for"
    if rank(wanted) >= rank(Containment.NAMESPACES) and namespaces_available():
        return Probe(Containment.NAMESPACES, why)
    if rank(wanted) >= rank(Containment.NAMESPACES):
        why += "; no namespaces either (they need root, unshare and setpriv)"
    return Probe(Containment.NONE, why.lstrip("; "))


# -- uids -------------------------------------------------------------------------------------

_uid_lock = threading.Lock()
_uids_in_use: set[int] = set()


def allocate_uid(uids: tuple[int, int]) -> int:
    """A uid in [lo, hi) no live worker of this judge holds, drawn at random (two judges rarely meet)."""
    lo, hi = uids
    with _uid_lock:
        for _ in range(1000):
            uid = lo + secrets.randbelow(hi - lo)
            if uid not in _uids_in_use:
                _uids_in_use.add(uid)
                return uid
    raise RuntimeError(f"no free worker uid in [{lo}, {hi})")


def release_uid(uid: int) -> None:
    with _uid_lock:
        _uids_in_use.discard(uid)


# -- starting and finding the worker's processes ----------------------------------------------

# One thread that lives as long as the judge starts every contained worker: bwrap's parent-death
# signal fires when the thread that started it ends, and pool threads come and go.
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernelrl-spawn")


def spawn(start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """Run `start` (a Popen) in the judge's long-lived spawning thread; its exceptions are raised here."""
    return _spawner.submit(start).result()


def _nspids(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(v) for v in line.split()[1:]]
    except OSError:
        pass
    return []


def ns_pid(pid: int) -> int | None:
    """`pid`'s number in its own PID namespace (None once it is gone)."""
    ns = _nspids(pid)
    return ns[-1] if ns else None


def process_limit(pid: int) -> int | None:
    """The soft limit on processes of `pid`, as the kernel shows it (None: unlimited or unreadable)."""
    try:
        with open(f"/proc/{pid}/limits") as f:
            for line in f:
                if line.startswith("Max processes"):
                    value = line.split()[2]
                    return int(value) if value.isdigit() else None
    except OSError:
        pass
    return None


def widen_pipe(fd: int) -> None:
    """A 1 MiB pipe buffer (Linux), so tensors cross in fewer, larger writes; else the default."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except OSError:
        pass


def sandbox_processes(pid: int, depth: int = 64) -> list[int]:
    """`pid` and every live descendant (orphans of a PID namespace are its first process's children)."""
    out = [pid] if os.path.exists(f"/proc/{pid}") else []
    out += descendants(pid, depth)
    return out


_TICK_NS = 1_000_000_000 // (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def process_cpu_ns(pid: int) -> int:
    """CPU time of one process from the kernel: its threads (scheduler statistics, ns; or its
    accounting in ticks where that is more, as ended threads count there) and its reaped children."""
    threads = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    threads += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # a thread ended while we read
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    except (OSError, ValueError):
        return threads
    return max(threads, (utime + stime) * _TICK_NS) + (cutime + cstime) * _TICK_NS


def find_in_namespace(outer: int, inner_pid: int) -> tuple[int | None, int | None]:
    """(the process that is `inner_pid` in its own PID namespace, that namespace's first process),
    both as the judge numbers them, among `outer`'s descendants."""
    found = init = None
    for p in descendants(outer):
        ns = _nspids(p)
        if len(ns) < 2:
            continue
        if ns[-1] == 1 and init is None:
            init = p
        if ns[-1] == inner_pid and found is None:
            found = p
    return found, init


def pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits (Linux 5.3+); None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def exited(fd: int | None, timeout_s: float = 0.0) -> bool:
    if fd is None:
        return False
    ready, _, _ = select.select([fd], [], [], timeout_s)
    return bool(ready)


# -- the judge's view of a worker's scratch ---------------------------------------------------

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Scratch:
    """A fully contained worker's scratch (/tmp) as the judge reaches it: /proc/PID/root, then one
    component at a time, never through a link, only on the scratch's own file system (the device
    recorded before the worker was given a program), only files owned by the worker's uid.

    A worker that mounts something of its own or links to a file it could not read itself gets
    nothing out of the judge: such files are on another device or another owner's.
    """

    def __init__(self, fd: int, *, dev: int, uid: int) -> None:
        self.fd = fd
        self.dev = dev
        self.uid = uid

    @classmethod
    def open(cls, pid: int, *, pid_fd: int | None, dev: int, uid: int) -> Scratch | None:
        try:
            fd = os.open(f"/proc/{pid}/root{SCRATCH}", _DIR)
        except OSError:
            return None
        # The pid still names the worker only while its pidfd has not reported an exit.
        if pid_fd is None or exited(pid_fd) or os.fstat(fd).st_dev != dev:
            os.close(fd)
            return None
        return cls(fd, dev=dev, uid=uid)

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def folder(self, rel: str, *, create: bool = False) -> int | None:
        """A descriptor for the folder `rel` (under the scratch), made (owned by the worker) if asked."""
        fd = os.dup(self.fd)
        for name in [p for p in rel.split("/") if p]:
            if name in (".", ".."):
                os.close(fd)
                return None
            if create:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                    os.chown(name, self.uid, self.uid, dir_fd=fd, follow_symlinks=False)
                except FileExistsError:
                    pass
                except OSError:
                    os.close(fd)
                    return None
            try:
                nxt = os.open(name, _DIR, dir_fd=fd)
            except OSError:
                os.close(fd)
                return None
            os.close(fd)
            fd = nxt
            if os.fstat(fd).st_dev != self.dev:
                os.close(fd)
                return None
        return fd

    def entries(self, folder: int) -> list[tuple[str, os.stat_result]]:
        """What a folder holds, links and all, each with its own (not followed) status."""
        out = []
        for name in os.listdir(folder):
            try:
                out.append((name, os.stat(name, dir_fd=folder, follow_symlinks=False)))
            except OSError:
                continue
        return out

    def read(self, folder: int, name: str, limit: int) -> tuple[bytes, int] | None:
        """(content, mtime in ns) of a plain file of the worker's, at most `limit` bytes; else None."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if (not stat.S_ISREG(st.st_mode) or st.st_dev != self.dev or st.st_uid != self.uid
                    or st.st_nlink != 1 or st.st_size > limit):
                return None
            chunks, size = [], 0
            while size <= limit:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            return (b"".join(chunks), st.st_mtime_ns) if size <= limit else None
        except OSError:
            return None
        finally:
            os.close(fd)

    def write(self, folder: int, name: str, data: bytes, mtime_ns: int) -> None:
        """A new file, owned by the worker, with the given modification time (OSError if it exists)."""
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchown(fd, self.uid, self.uid)
            os.utime(fd, ns=(mtime_ns, mtime_ns))
        finally:
            os.close(fd)

