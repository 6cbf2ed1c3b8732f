"""What containment costs a worker's start: time from spawn to hello, per containment level.

Starts N workers one after another at each level this machine offers (full: bubblewrap;
namespaces: unshare + setpriv; none), in an interleaved order so drift hits every level alike,
and prints the median and spread of spawn-to-hello (a fresh interpreter importing torch) and of
the sandbox setup alone (bwrap / unshare running `true`). Levels this machine cannot give are
skipped, with the reason. Where the judge forks its workers (`SandboxConfig.fork_workers`: root,
full containment, a cgroup per worker) a row `full, forked` times the judge's own start of one,
from `Worker(...)` to its hello (`kernelrl.judge.isolation.zygote`; the zygote's own start is left out: it
is started once, before the first); where it does not, a line says why (not root, or no cgroup v2
it can give each worker).

What a forked worker sees from inside (uid, capabilities, seccomp, its namespaces and
descriptors) is tested against a spawned one in tests/judge/isolation/test_zygote.py.

    python3 benchmarks/worker_start.py [--n 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelrl.judge.harness.device import Device  # noqa: E402
from kernelrl.judge.isolation.containment import NAMESPACES_PREFIX, bwrap_prefix, probe  # noqa: E402
from kernelrl.judge.isolation.sandbox import SandboxConfig, Worker  # noqa: E402
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


def why_not_forked() -> str | None:
    """None where the judge forks its workers here (and its zygote started: it is not timed), else
    why it spawns them: the conditions `Worker` checks besides full containment and a CPU device."""
    try:
        hello_s(Containment.FULL, fork=True)
    except RuntimeError:
        import os

        from kernelrl.judge.isolation import cgroup

        if os.geteuid() != 0:
            return "the judge is not root"
        if not cgroup.available():
            return "no cgroup v2 the judge can give each worker (kernelrl.judge.isolation.cgroup.available())"
        return "a worker asked to fork came out spawned"
    return None


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10, help="workers started per level")
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
    why = why_not_forked() if Containment.FULL in levels else "no full containment here"
    fork = why is None
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
    else:
        print(f"full, forked: not here ({why})")

if __name__ == "__main__":
    main()
