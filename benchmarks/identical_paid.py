"""Is identical code paid? A task's reference, submitted as a candidate, judged N times (each a
source of its own, so nothing is reused), optionally beside K processes loading the CPU.

What the reward must do with it: pay 1.0x every time. Each run prints the measured speedup and its
95 % interval, what the group's A/A copy measured, the noise band the result carries, the exchange
taken off every sample and the calls per sample, and what `kernelrl.reward.within_noise` makes of
it ("noise": paid as 1.0x). Ends with how many runs would be paid a speedup above 1.0x, and the
largest of them. The load is `--load K` interpreters that import torch and multiply 2000 x 2000
matrices one after another (bursty: a start, then a few hundred ms of matmul, then a start again),
all ended when the script ends.

`--numel N,N,N --copies C` (issue 57: the identical-code spread at several kernel lengths): per
length, a one-pass elementwise task over N floats (`x * 2 + 1`, its length set by N alone) with C
identical copies of its reference judged as one group (measured side by side, as a GRPO group's
members are); per length the reference's median time, every copy's speedup and the spread (largest
over smallest). One batch, so the lengths share the judge's start.

Usage: python benchmarks/identical_paid.py [level1/gelu] [--runs 12] [--load 2] [--device cpu]
       [--size small] [--max-timing-s 1.5]
       python benchmarks/identical_paid.py --numel 16777216,134217728,1073741824 --copies 3 --device cuda
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
from kernelrl.tasks.task import Task

_LOAD = ("import subprocess, sys\n"
         "while True:\n"
         "    subprocess.run([sys.executable, '-c', 'import torch; torch.randn(2000, 2000) @ torch.randn(2000, 2000)'])\n")


def length_task(numel: int) -> Task:
    """A one-pass elementwise task over `numel` floats, at that length at every size preset."""
    source = (f'import torch\nimport torch.nn as nn\n\nN = {numel}\n\n\n'
              'class Model(nn.Module):\n'
              '    """x * 2 + 1 over N floats: its time is set by N alone."""\n\n'
              '    def forward(self, x):\n'
              '        return x * 2.0 + 1.0\n\n\n'
              'def get_inputs():\n    return [torch.randn(N)]\n\n\n'
              'def get_init_inputs():\n    return []\n')
    return Task(name=f"lengths/n{numel}", source=source, presets={"small": {"N": numel}, "full": {"N": numel}})


def spread(config: EvalConfig, numels: list[int], copies: int) -> int:
    """`--numel`: per length, `copies` identical copies of the reference judged as one group."""
    tasks = [length_task(n) for n in numels]
    items = [(t, Candidate(source=t.source.replace("class Model(", "class ModelNew(") + f"\n# copy {c}\n"))
             for t in tasks for c in range(copies)]
    t0 = time.monotonic()
    with Evaluator(config) as ev:
        results = ev.evaluate_batch(items)
    print(f"{'numel':>12s} {'ref ms':>9s}  {'copies (speedup)':40s} {'spread':>7s}  paid above 1.0x")
    correct = 0
    for k in range(len(tasks)):
        got = results[k * copies:(k + 1) * copies]
        speeds = [r.speedup for r in got if r.status is Status.CORRECT and r.speedup is not None]
        correct += len(speeds)
        ref = next((r.ref_time.median_ms for r in got if r.ref_time is not None), None)
        shown = " ".join(f"{r.speedup:.3f}" if r.speedup is not None else r.status.value for r in got)
        paid = sum(1 for r in got if r.speedup is not None and r.speedup > 1.0 and not within_noise(r))
        print(f"{numels[k]:12d} {ref if ref is not None else float('nan'):9.4f}  {shown:40s} "
              f"{max(speeds) / min(speeds) if speeds else float('nan'):7.3f}  {paid} of {len(got)}", flush=True)
    print(f"# {len(tasks)} lengths x {copies} identical copies, {correct} correct; {time.monotonic() - t0:.0f} s")
    return 0 if correct else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", nargs="?", default="level1/gelu")
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--load", type=int, default=0, help="background processes loading the CPU")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--size", choices=("small", "full"), default="small")
    parser.add_argument("--max-timing-s", type=float, default=1.5)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--numel", default=None, metavar="N[,N]",
                        help="the spread at these kernel lengths instead (one elementwise task per N)")
    parser.add_argument("--copies", type=int, default=3, help="with --numel: identical copies per length")
    args = parser.parse_args()
    if args.runs < 1 or not 0 <= args.load <= 16 or args.max_timing_s <= 0:
        parser.error("--runs >= 1, 0 <= --load <= 16, --max-timing-s > 0")
    try:
        numels = [int(v) for v in args.numel.split(",")] if args.numel else []
    except ValueError:
        parser.error(f"--numel: whole numbers, comma-separated, not {args.numel!r}")
    if any(n < 1 for n in numels) or args.copies < 2:
        parser.error("--numel values >= 1 and --copies >= 2 (a spread needs two copies)")
    extra = {"cache_dir": args.cache_dir} if args.cache_dir else {}
    config = EvalConfig(device=args.device, size=args.size, roofline=False,
                        timing=TimingConfig(max_timing_s=args.max_timing_s), **extra)
    print(machine.header(args.device))
    print(f"# command: {' '.join(sys.argv)}")
    if numels:
        return spread(config, numels, args.copies)
    load = [subprocess.Popen([sys.executable, "-c", _LOAD], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(args.load)]
    task = builtin_task(args.task)
    source = task.source.replace("class Model(", "class ModelNew(")
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
