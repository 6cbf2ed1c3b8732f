"""Is identical code paid? A task's reference, submitted as a candidate, judged N times (each a
source of its own, so nothing is reused), optionally beside K processes loading the CPU.

What the reward must do with it: pay 1.0x every time. Each run prints the measured speedup and its
95 % interval, what the group's A/A copy measured, the noise band the result carries, the exchange
taken off every sample and the calls per sample, and what `kernelrl.reward.within_noise` makes of
it ("noise": paid as 1.0x). Ends with how many runs would be paid a speedup above 1.0x, and the
largest of them. The load is `--load K` interpreters that import torch and multiply 2000 x 2000
matrices one after another (bursty: a start, then a few hundred ms of matmul, then a start again),
all ended when the script ends.

Usage: python benchmarks/identical_paid.py [level1/gelu] [--runs 12] [--load 2] [--device cpu]
       [--size small] [--max-timing-s 1.5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import machine

from kernelrl.candidate import Candidate
from kernelrl.judge.eval_config import TimingConfig
from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.result import Status
from kernelrl.reward import within_noise
from kernelrl.tasks.suites import builtin_task

_LOAD = ("import subprocess, sys\n"
         "while True:\n"
         "    subprocess.run([sys.executable, '-c', 'import torch; torch.randn(2000, 2000) @ torch.randn(2000, 2000)'])\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", nargs="?", default="level1/gelu")
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--load", type=int, default=0, help="background processes loading the CPU")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--size", choices=("small", "full"), default="small")
    parser.add_argument("--max-timing-s", type=float, default=1.5)
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args()
    if args.runs < 1 or not 0 <= args.load <= 16 or args.max_timing_s <= 0:
        parser.error("--runs >= 1, 0 <= --load <= 16, --max-timing-s > 0")
    task = builtin_task(args.task)
    source = task.source.replace("class Model(", "class ModelNew(")
    extra = {"cache_dir": args.cache_dir} if args.cache_dir else {}
    config = EvalConfig(device=args.device, size=args.size, roofline=False,
                        timing=TimingConfig(max_timing_s=args.max_timing_s), **extra)
    print(machine.header(args.device))
    print(f"# command: {' '.join(sys.argv)}")
    load = [subprocess.Popen([sys.executable, "-c", _LOAD], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(args.load)]
    paid: list[float] = []
    exchange: list[float] = []
    t0 = time.monotonic()
    try:
        with Evaluator(config) as ev:
            print(f"{'run':>3s} {'speedup':>8s} {'interval':>15s} {'A/A':>6s} {'noise band':>15s} "
                  f"{'exch ms':>8s} {'calls':>5s}  paid")
            for i in range(args.runs):
                res = ev.evaluate(task, Candidate(source=f"{source}\n# identical copy {i}\n"))
                if res.status is not Status.CORRECT or res.speedup is None:
                    print(f"{i:3d} {res.status.value}: {res.message}")
                    continue
                timing = res.environment.timing
                noise = within_noise(res)
                paid.append(1.0 if noise else res.speedup)
                if timing is not None:
                    exchange.append(timing.exchange_ms)
                ci = f"{res.speedup_ci[0]:.3f}-{res.speedup_ci[1]:.3f}" if res.speedup_ci else "-"
                band = f"{res.noise_band[0]:.3f}-{res.noise_band[1]:.3f}" if res.noise_band else "-"
                aa = f"{timing.aa_speedup:.3f}" if timing is not None and timing.aa_speedup else "-"
                print(f"{i:3d} {res.speedup:8.3f} {ci:>15s} {aa:>6s} {band:>15s} "
                      f"{timing.exchange_ms if timing else 0.0:8.3f} {timing.calls_per_sample if timing else 0:5d}  "
                      + ("1.0x (noise)" if noise else f"{res.speedup:.3f}x"), flush=True)
    finally:
        for p in load:
            p.kill()
            p.wait()
    above = [p for p in paid if p > 1.0]
    print(f"# identical code paid above 1.0x: {len(above)} of {len(paid)} correct runs"
          + (f" (largest {max(above):.3f}x)" if above else "")
          + (f"; exchange per sample median {statistics.median(exchange):.3f} ms" if exchange else "")
          + f"; load {args.load}; {time.monotonic() - t0:.0f} s")
    return 0 if paid else 1


if __name__ == "__main__":
    sys.exit(main())
