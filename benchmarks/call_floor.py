"""The per-call floor: what an empty call costs when timed the way the worker times a call.

The worker brackets every timed call with a device-wide synchronisation and reads the host clock
(`kernelrl.judge.harness.worker`: sync, perf_counter_ns, call, sync, perf_counter_ns). Whatever a call
does, that bracket keeps dispatch, launch and the synchronisation's wake-up in its time. This
script measures, in one process and interleaved round by round:

- `sync`: the bracket around nothing (two synchronisations, no work);
- `python_call`: the bracket around a Python function returning its input (no device work);
- `empty_kernel`: the bracket around one kernel on a one-element tensor (`x.add_(0)`):
  dispatch + launch + completion + wake-up, the floor of any call that runs a kernel;
- on CUDA, `empty_kernel_events`: the same kernel timed by CUDA events (device time only).

One JSON line per measure (median, 10th and 90th percentile, in microseconds, and n) is appended
to `--json` as each ends, and printed. Not measured: the judge's exchange with the worker (the
timer subtracts that separately) and cache effects of real inputs.

Usage: python benchmarks/call_floor.py [--device cuda] [--n 2000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from kernelrl.judge.harness.bench import sync_every_gpu


def _row(name: str, device: str, ns: list[float]) -> dict[str, Any]:
    q = statistics.quantiles(ns, n=10) if len(ns) >= 10 else [min(ns)] * 9
    return {"measure": name, "device": device, "n": len(ns), "median_us": round(statistics.median(ns) / 1e3, 3),
            "p10_us": round(q[0] / 1e3, 3), "p90_us": round(q[-1] / 1e3, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--n", type=int, default=2000, help="calls per measure")
    parser.add_argument("--json", type=Path, default=None, help="append one line per measure here")
    args = parser.parse_args()
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("call_floor: --device cuda but no CUDA device", file=sys.stderr)
        return 2
    devices = torch.cuda.device_count() if device == "cuda" else 0

    def sync() -> None:
        if device == "cuda":
            sync_every_gpu(devices)

    x = torch.zeros(1, device=device)

    def nothing() -> None:
        return None

    def identity() -> torch.Tensor:
        return x

    def kernel() -> torch.Tensor:
        return x.add_(0)

    measures = {"sync": nothing, "python_call": identity, "empty_kernel": kernel}
    times: dict[str, list[float]] = {name: [] for name in measures}
    with torch.no_grad():
        for fn in measures.values():  # warm-up: the first launch loads the kernel
            for _ in range(20):
                sync()
                fn()
                sync()
        for _ in range(args.n):
            for name, fn in measures.items():
                sync()
                t0 = time.perf_counter_ns()
                fn()
                sync()
                times[name].append(time.perf_counter_ns() - t0)
        rows = [_row(name, device, ns) for name, ns in times.items()]
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev: list[float] = []
            for _ in range(args.n):
                start.record()
                kernel()
                end.record()
                end.synchronize()
                ev.append(start.elapsed_time(end) * 1e6)
            rows.append(_row("empty_kernel_events", device, ev))
    for row in rows:
        print(json.dumps(row), flush=True)
        if args.json is not None:
            with args.json.open("a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
