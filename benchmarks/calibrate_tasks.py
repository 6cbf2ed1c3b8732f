"""A/A calibration on several tasks: identical code must measure 1.00 (issue 25, item 4).

For each task, `Evaluator.calibrate` (what `kernelrl calibrate TASK --runs N` runs): N timing
groups, each the task's reference against two identical copies of itself; every run prints the
copies' speedups against the reference and against each other, and whether all three are
within 1 +- tolerance. Ends with the count of runs within it and the largest deviation.

Usage: python benchmarks/calibrate_tasks.py [--device cuda] [--size full] [--runs 5] [--tolerance 0.01]
       [--limit N] [--tasks level1/softmax ...]
Tiny CPU check: python benchmarks/calibrate_tasks.py --device cpu --limit 2 --runs 1 --quick
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import machine

from kernelrl.judge.calibration import Calibration
from kernelrl.judge.eval_config import TimingConfig
from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.judge.reference import ReferenceFailed
from kernelrl.tasks.suites import builtin_task

# Six tasks across the shapes of work: a reduction, a normalisation, a GEMM, a GEMM with an
# epilogue, a convolution chain and a stencil.
TASKS = ("level1/softmax", "level1/rmsnorm", "level1/matmul_square", "level2/linear_bias_gelu_scale",
         "level2/conv2d_batchnorm_relu", "operators/heat3d_stencil")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--size", choices=("small", "full"), default="full")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tolerance", type=float, default=0.01)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    parser.add_argument("--quick", action="store_true", help="short timing (a smoke test, not a measurement)")
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args()
    if args.runs < 1 or args.tolerance <= 0:
        parser.error("--runs >= 1 and --tolerance > 0")
    tasks = [builtin_task(name) for name in args.tasks[: args.limit]]
    timing = TimingConfig(min_rounds=5, max_rounds=20, max_timing_s=2.0) if args.quick else TimingConfig()
    extra = {"cache_dir": args.cache_dir} if args.cache_dir else {}
    config = EvalConfig(device=args.device, size=args.size, timing=timing, roofline=False, **extra)
    print(machine.header(args.device))
    print(f"# command: {' '.join(sys.argv)}")
    print(f"{'task':34s} {'run':>3s} {'copy a':>8s} {'copy b':>8s} {'b / a':>8s} {'rounds':>6s} {'ref ms':>9s} "
          f"{'calls':>5s} {'exch ms':>7s}  within  elapsed")
    within = total = 0
    worst = 0.0
    failed = []
    t0 = time.monotonic()
    runs_of: Counter[str] = Counter()

    def report(r: Calibration) -> None:
        nonlocal within, total, worst
        ok = r.within(args.tolerance)
        within += ok
        total += 1
        runs_of[r.task] += 1
        worst = max(worst, *(abs(s - 1) for s in (r.speedup_a, r.speedup_b, r.b_over_a)))
        print(f"{r.task:34s} {runs_of[r.task]:3d} {r.speedup_a:8.4f} {r.speedup_b:8.4f} {r.b_over_a:8.4f} "
              f"{r.rounds:6d} {r.reference_ms:9.4f} {r.calls_per_sample:5d} {r.exchange_ms:7.3f}  "
              f"{'yes' if ok else 'NO'}  {time.monotonic() - t0:.0f} s", flush=True)
        if r.phases is not None:  # where the run's time went: fixed costs against the timed rounds
            print(f"    phases (s): {r.phases.describe()}", flush=True)

    with Evaluator(config) as ev:
        for task in tasks:
            try:
                ev.calibrate(task, runs=args.runs, on_run=report)
            except ReferenceFailed as e:
                failed.append(f"{task.name}: {str(e).splitlines()[0]}")
                print(f"{task.name:34s} failed: {str(e).splitlines()[0]}", flush=True)
    print(f"\n{within}/{total} runs within 1 +- {args.tolerance:g}; largest |speedup - 1| {worst:.4f}; "
          f"{len(failed)} task(s) failed; {time.monotonic() - t0:.0f} s")
    for line in failed:
        print(f"  failed: {line}")
    return 0 if total and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
