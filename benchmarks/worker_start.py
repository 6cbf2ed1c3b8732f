"""What containment costs a worker's start: time from spawn to hello, per containment level.

Starts N workers one after another at each level this machine offers (full: bubblewrap;
namespaces: unshare + setpriv; none), in an interleaved order so drift hits every level alike,
and prints the median and spread of spawn-to-hello (a fresh interpreter importing torch) and of
the sandbox setup alone (bwrap / unshare running `true`). Levels this machine cannot give are
skipped, with the reason.

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

from kernelrl.judge.containment import NAMESPACES_PREFIX, bwrap_prefix, probe  # noqa: E402
from kernelrl.judge.device import Device  # noqa: E402
from kernelrl.judge.sandbox import SandboxConfig, Worker  # noqa: E402
from kernelrl.result import Containment  # noqa: E402


def hello_s(level: Containment) -> float:
    t0 = time.perf_counter()
    w = Worker(config=SandboxConfig(containment=level), device=Device.CPU)
    try:
        w.wait_ready(deadline=time.monotonic() + 120)
        return time.perf_counter() - t0
    finally:
        w.close()


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
    for i in range(args.n):
        for level in levels[i % len(levels):] + levels[:i % len(levels)]:
            hello[level].append(hello_s(level))
            setup[level].append(setup_s(level))
    print(f"{'containment':<12} {'spawn->hello median':>20} {'min..max':>16} {'sandbox alone median':>22}")
    for level in levels:
        h, s = hello[level], setup[level]
        print(f"{level.value:<12} {statistics.median(h) * 1e3:>17.0f} ms {min(h) * 1e3:>7.0f}..{max(h) * 1e3:<6.0f} "
              f"{statistics.median(s) * 1e3:>19.1f} ms")


if __name__ == "__main__":
    main()
