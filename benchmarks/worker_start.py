"""What containment costs a worker's start: time from spawn to hello, per containment level.

Starts N workers one after another at each level this machine offers (full: bubblewrap;
namespaces: unshare + setpriv; none), in an interleaved order so drift hits every level alike,
and prints the median and spread of spawn-to-hello (a fresh interpreter importing torch) and of
the sandbox setup alone (bwrap / unshare running `true`). Levels this machine cannot give are
skipped, with the reason. Where the judge forks its workers (`SandboxConfig.fork_workers`: root,
full containment, a cgroup per worker) a row `full, forked` times the judge's own start of one,
from `Worker(...)` to its hello (`kernelrl.judge.zygote`; the zygote's own start is left out: it
is started once, before the first).

With `--forked` (root, full containment only) it also measures the step alone, outside the judge:
this interpreter, torch already imported, forks; the child joins the namespaces of a fresh
bubblewrap sandbox (the judge's own command line, holding a `sleep`), forks again into its PID
namespace, drops to the worker's uid with no capabilities, installs the judge's seccomp program,
closes every other descriptor, runs one torch operation and reports. Printed: request to report,
and what the joined process sees (its uid, capabilities, seccomp mode, the processes and
descriptors it can see), so the figure is the start of a process as contained as a worker.
Not measured: a real worker's protocol, limits, cgroup and environment; this is the cost of the
step that replaces `import torch`.

    python3 benchmarks/worker_start.py [--n 10] [--forked]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelrl.judge.containment import NAMESPACES_PREFIX, bwrap_prefix, find_in_namespace, probe  # noqa: E402
from kernelrl.judge.device import Device  # noqa: E402
from kernelrl.judge.sandbox import SandboxConfig, Worker  # noqa: E402
from kernelrl.result import Containment  # noqa: E402


def hello_s(level: Containment, *, fork: bool = False) -> float:
    t0 = time.perf_counter()
    w = Worker(config=SandboxConfig(containment=level, fork_workers=fork), device=Device.CPU)
    try:
        w.wait_ready(deadline=time.monotonic() + 120)
        if w.forked is not fork:
            raise RuntimeError("the judge does not fork workers here")
        return time.perf_counter() - t0
    finally:
        w.close()


def forks_here() -> bool:
    """Whether the judge forks its workers here (and its zygote started: it is not timed)."""
    try:
        hello_s(Containment.FULL, fork=True)
    except RuntimeError:
        return False
    return True


def setup_s(level: Containment) -> float:
    """The sandbox alone: the same prefix running `true`."""
    import os
    import shutil

    if level is Containment.FULL:
        prefix = bwrap_prefix(bwrap=shutil.which("bwrap") or "bwrap", uid=SandboxConfig().uids[0], device=Device.CPU,
                              scratch_bytes=1 << 30, as_root=os.geteuid() == 0)
    elif level is Containment.NAMESPACES:
        prefix = list(NAMESPACES_PREFIX)
    else:
        prefix = []
    t0 = time.perf_counter()
    subprocess.run([*prefix, "true"], check=True)
    return time.perf_counter() - t0


def forked_s(uid: int) -> tuple[float, dict[str, object]]:
    """A fork of this interpreter joining a fresh bubblewrap sandbox (see the module docstring):
    seconds from the request to the joined process's report, and the report."""
    import ctypes
    import json
    import os
    import shutil

    import torch

    from kernelrl.judge.seccomp import program

    libc = ctypes.CDLL(None, use_errno=True)
    kinds = {"cgroup": 0x02000000, "ipc": 0x08000000, "net": 0x40000000, "uts": 0x04000000,
             "pid": 0x20000000, "mnt": 0x00020000}  # CLONE_NEW*; the mount namespace last (it moves the root)
    t0 = time.perf_counter()
    argv = bwrap_prefix(bwrap=shutil.which("bwrap") or "bwrap", uid=uid, device=Device.CPU, scratch_bytes=32 << 20,
                        as_root=True)
    holder = subprocess.Popen([*argv, "sleep", "1000"], start_new_session=True)
    try:
        inside = None
        while inside is None:  # the holder: second in its PID namespace (bubblewrap's reaper is first)
            inside, _ = find_in_namespace(holder.pid, 2)
            try:
                if inside is not None and Path(f"/proc/{inside}/comm").read_text().strip() != "sleep":
                    inside = None  # not exec'd yet: the sandbox is not finished
            except OSError:
                inside = None
            if inside is None:
                if time.perf_counter() - t0 > 30:
                    raise RuntimeError("the sandbox did not start")
                time.sleep(0.002)
        r, w = os.pipe()
        code = program()
        pid = os.fork()
        if pid == 0:  # the child: nothing here may return into the benchmark
            try:
                os.close(r)
                ns = {k: os.open(f"/proc/{inside}/ns/{k}", os.O_RDONLY) for k in kinds}
                for k, flag in kinds.items():
                    if libc.setns(ns[k], flag) != 0:
                        raise OSError(ctypes.get_errno(), f"setns {k}")
                    os.close(ns[k])
                if os.fork():
                    os._exit(0)
                os.closerange(3, w)
                os.closerange(w + 1, 1 << 16)
                os.chdir("/tmp")
                for cap in range(64):
                    libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)  # from root to a plain uid: every capability goes
                if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
                    raise OSError(ctypes.get_errno(), "no_new_privs")
                if code is not None:
                    class SockFprog(ctypes.Structure):
                        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

                    buf = ctypes.create_string_buffer(code, len(code))
                    fprog = SockFprog(len(code) // 8, ctypes.addressof(buf))  # 8 bytes an instruction
                    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
                        raise OSError(ctypes.get_errno(), "seccomp")
                status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines()
                              if ":" in line)
                report = {"uid": os.getuid(), "CapEff": status["CapEff"].strip(), "CapBnd": status["CapBnd"].strip(),
                          "Seccomp": status["Seccomp"].strip(), "NoNewPrivs": status["NoNewPrivs"].strip(),
                          "processes": sorted(int(x) for x in os.listdir("/proc") if x.isdigit()),
                          "fds": sorted(int(x) for x in os.listdir("/proc/self/fd")),
                          "unshare": "refused" if libc.unshare(0x10000000) != 0 else "made",
                          "torch": float(torch.arange(4.0).sum())}
                os.write(w, json.dumps(report).encode())
                os._exit(0)
            except BaseException as e:  # noqa: BLE001 - reported, then the child ends
                os.write(w, json.dumps({"error": repr(e)}).encode())
                os._exit(1)
        os.close(w)
        os.waitpid(pid, 0)
        out = b""
        while chunk := os.read(r, 1 << 16):
            out += chunk
        os.close(r)
        return time.perf_counter() - t0, json.loads(out)
    finally:
        holder.kill()
        holder.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10, help="workers started per level")
    ap.add_argument("--forked", action="store_true",
                    help="also time a fork of this interpreter joining a fresh sandbox (root, full containment)")
    args = ap.parse_args()
    levels = []
    for level in (Containment.FULL, Containment.NAMESPACES, Containment.NONE):
        got = probe(level, SandboxConfig().uids)
        if got.level is level:
            levels.append(level)
        else:
            print(f"{level.value}: not available here ({got.reason})")
    hello: dict[Containment, list[float]] = {lv: [] for lv in levels}
    setup: dict[Containment, list[float]] = {lv: [] for lv in levels}
    forked: list[float] = []
    fork = Containment.FULL in levels and forks_here()
    for i in range(args.n):
        for level in levels[i % len(levels):] + levels[:i % len(levels)]:
            hello[level].append(hello_s(level))
            setup[level].append(setup_s(level))
            if fork and level is Containment.FULL:
                forked.append(hello_s(level, fork=True))
    print(f"{'containment':<12} {'spawn->hello median':>20} {'min..max':>16} {'sandbox alone median':>22}")
    for level in levels:
        h, s = hello[level], setup[level]
        print(f"{level.value:<12} {statistics.median(h) * 1e3:>17.0f} ms {min(h) * 1e3:>7.0f}..{max(h) * 1e3:<6.0f} "
              f"{statistics.median(s) * 1e3:>19.1f} ms")
    if forked:
        print(f"{'full, forked':<12} {statistics.median(forked) * 1e3:>17.0f} ms "
              f"{min(forked) * 1e3:>7.0f}..{max(forked) * 1e3:<6.0f}")
    if args.forked:
        import os

        from kernelrl.judge.containment import allocate_uid, release_uid

        if os.geteuid() != 0 or Containment.FULL not in levels:
            raise SystemExit("--forked needs root and full containment here")
        times: list[float] = []
        report: dict[str, object] = {}
        for _ in range(args.n):
            uid = allocate_uid(SandboxConfig().uids)
            try:
                t, report = forked_s(uid)
            finally:
                release_uid(uid)
            if "error" in report:
                raise SystemExit(f"the forked start failed: {report['error']}")
            times.append(t)
        print(f"{'forked+join':<12} {statistics.median(times) * 1e3:>17.0f} ms {min(times) * 1e3:>7.0f}.."
              f"{max(times) * 1e3:<6.0f} (sandbox included)")
        print(f"what the joined process saw (the last of {args.n}): {report}")


if __name__ == "__main__":
    main()
