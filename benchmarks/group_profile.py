"""Where one timing group's wall time goes: the judge's fixed cost per group, phase by phase.

One task's PyTorch-level candidates from `eval_throughput.py`'s batch (an inference-mode rewrite,
two identical copies of the reference, an incorrect one, one that raises) are judged as one
group by one `Evaluator`, twice: the first run learns the task (constants, profile, peaks) and
warms the pool; the second is the one shown. Printed per phase (seconds): the reference's load
and outputs, the candidates' checks, the timing pool, the measurement (its setup and warm-up,
its timed rounds, its spot checks), and the group's wall time; with `--cprofile N`, the N
functions of the judging process that took longest, cumulatively.

Usage: python benchmarks/group_profile.py [--task level1/softmax] [--runs 1] [--cprofile 25]
Numbers depend on the machine and its load; compare phases of one run, or runs on a quiet machine.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import pstats
import sys
import time
from pathlib import Path

from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.plain import to_plain
from kernelrl.tasks.suites import builtin_task


def _throughput_module():
    """`eval_throughput.py`, whose batch this profile takes its candidates from."""
    spec = importlib.util.spec_from_file_location("eval_throughput", Path(__file__).with_name("eval_throughput.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["eval_throughput"] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="level1/softmax")
    parser.add_argument("--runs", type=int, default=1, help="profiled runs after the warm one")
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--cprofile", type=int, default=0, metavar="N", help="print the N costliest functions")
    args = parser.parse_args()
    throughput = _throughput_module()
    task = builtin_task(args.task)
    items = [i for i in throughput.batch() if i.task.name == task.name and i.kind in ("rewrite", "twin", "incorrect",
                                                                                       "raises")]
    print(f"{task.name}: {len(items)} candidates ({', '.join(i.kind for i in items)})", flush=True)
    config = EvalConfig(timeout_s=args.timeout)
    with Evaluator(config) as ev:
        t0 = time.monotonic()
        ev.evaluate_batch([(i.task, i.candidate) for i in items])
        print(f"warm-up run (learns the task, measures the peaks): {time.monotonic() - t0:.1f} s", flush=True)
        for run in range(args.runs):
            # Fresh sources: a result already judged would come from the cache.
            fresh = [(i.task, i.candidate.source + f"\n# profiled run {run}\n") for i in items]
            profiler = cProfile.Profile() if args.cprofile else None
            t0 = time.monotonic()
            if profiler:
                profiler.enable()
            results = ev.evaluate_batch(fresh)
            if profiler:
                profiler.disable()
            wall = time.monotonic() - t0
            print(f"\nrun {run + 1}: {wall:.2f} s for the group; verdicts "
                  + ", ".join(f"{i.kind} {r.status.value}" for i, r in zip(items, results)))
            phases = next((r.environment.phases for r in results if r.environment.phases), None)
            if phases is not None:
                for name, seconds in to_plain(phases).items():
                    print(f"  {name:24s} {seconds:7.2f}")
            timing = next((r.environment.timing for r in results if r.environment.timing), None)
            if timing is not None:
                print(f"  rounds {timing.rounds}, calls per sample {timing.calls_per_sample}, stopped by "
                      f"{timing.stopped_by.value}; spot checks fetched {timing.spot_check_bytes / 2**20:.0f} MiB")
            if profiler:
                pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.cprofile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
