"""Evaluator throughput and repeatability, measured side by side in one run.

Prints:
- candidates/hour for the same 20 candidates (the shipped CPU examples, topped up with heuristic
  rewrites of quick-suite tasks): kernelrl's evaluator with a cold build cache, then warm, and a
  serial, uncached, in-process loop (build each candidate in this process, check 5 input sets,
  time 50 calls each of reference and candidate) as the naive baseline;
- the spread of 5 evaluations of one candidate (the reference itself, renamed), with the
  allocator pinned and, for comparison, with glibc's adaptive mmap threshold.

Usage: python benchmarks/eval_throughput.py [--workers 2] [--skip-naive] [--spread-only]
Numbers depend on the machine and its load; compare ratios from one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from kernelrl.candidate import Candidate
from kernelrl.judge.compare import compare_outputs
from kernelrl.judge.evaluator import EvalConfig, Evaluator, evaluate
from kernelrl.examples import list_examples
from kernelrl.search.proposers.heuristic import CPU_PORTFOLIO, applicable, render_rewrite, task_traits
from kernelrl.judge.sandbox import SandboxConfig
from kernelrl.tasks.suites import builtin_task, load_suite
from kernelrl.tasks.task import Task


def twenty_candidates() -> list[tuple[Task, Candidate]]:
    jobs = [(builtin_task(e.task), Candidate(source=e.source, origin=e.name)) for e in list_examples(device="cpu")]
    cheap = [r for r in CPU_PORTFOLIO if not r.compiles]
    for task in load_suite("small"):
        traits = task_traits(task)
        for rewrite in cheap:
            if len(jobs) >= 20:
                return jobs
            if applicable(rewrite, traits, "cpu"):
                src = render_rewrite(task, rewrite, traits)
                jobs.append((task, Candidate(source=src, origin=f"{task.name}:{rewrite.name}")))
    return jobs[:20]


def naive_in_process(jobs: list[tuple[Task, Candidate]]) -> tuple[float, int]:
    """Serial, uncached, in-process: what a simple evaluation script does."""
    t0 = time.monotonic()
    correct = 0
    for i, (task, cand) in enumerate(jobs):
        os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="naive-ext-")  # no build reuse
        tm = task.instantiate("small")
        try:
            path = Path(tempfile.mkdtemp()) / f"cand_{i}.py"
            path.write_text(cand.source)
            spec = importlib.util.spec_from_file_location(f"naive_cand_{i}", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            torch.manual_seed(0)
            ref = tm.Model(*tm.get_init_inputs())
            torch.manual_seed(0)
            new = mod.ModelNew(*tm.get_init_inputs())
            ok = True
            with torch.no_grad():
                for s in range(5):
                    torch.manual_seed(100 + s)
                    inputs = tm.get_inputs()
                    ok &= compare_outputs(new(*inputs), ref(*inputs)).ok
                for model in (ref, new):
                    for _ in range(3):
                        model(*inputs)
                    t = time.perf_counter()
                    for _ in range(50):
                        model(*inputs)
                    _ = time.perf_counter() - t
            correct += ok
        except Exception:  # noqa: BLE001 - a failing candidate still counts as judged
            pass
    return time.monotonic() - t0, correct


def spread(config: EvalConfig, task: Task, label: str) -> None:
    src = task.source + "\n\nModelNew = Model\n"
    speedups, cand_ms = [], []
    for _ in range(5):
        res = evaluate(task, src, config)
        speedups.append(res.speedup or float("nan"))
        cand_ms.append(res.cand_time.median_ms if res.cand_time else float("nan"))
    med = statistics.median(cand_ms)
    print(f"  {label}: speedups {', '.join(f'{s:.3f}' for s in speedups)} "
          f"(range {min(speedups):.3f}-{max(speedups):.3f}); candidate median ms across runs "
          f"{min(cand_ms):.4f}-{max(cand_ms):.4f} ({(max(cand_ms) - min(cand_ms)) / 2 / med * 100:.1f} % half-range)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument("--spread-only", action="store_true")
    parser.add_argument("--spread-task", default="level1/scaled_residual_add")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} cores")

    if not args.spread_only:
        jobs = twenty_candidates()
        print(f"{len(jobs)} candidates: " + ", ".join(c.origin for _, c in jobs))
        cache = Path(tempfile.mkdtemp(prefix="kernelrl-bench-cache-"))
        config = EvalConfig(cache_dir=cache)
        for label in ("cold cache", "warm cache"):
            t0 = time.monotonic()
            results = Evaluator(dataclasses.replace(config, concurrency=args.workers)).evaluate_batch(jobs)
            wall = time.monotonic() - t0
            counts: dict[str, int] = {}
            for r in results:
                counts[r.status.value] = counts.get(r.status.value, 0) + 1
            print(f"kernelrl evaluator, {label}, {args.workers} workers: {wall:.1f} s, "
                  f"{len(jobs) / wall * 3600:.0f} candidates/hour ({counts})")
        if not args.skip_naive:
            wall, correct = naive_in_process(jobs)
            print(f"serial uncached in-process loop: {wall:.1f} s, {len(jobs) / wall * 3600:.0f} candidates/hour "
                  f"({correct} correct; no isolation, no hack checks)")

    print(f"spread of 5 evaluations of the reference against itself ({args.spread_task}, small):")
    task = builtin_task(args.spread_task)
    cache = Path(tempfile.mkdtemp(prefix="kernelrl-bench-spread-"))
    # The candidate is the reference renamed, which static rules refuse: only timing is measured.
    spread(EvalConfig(cache_dir=cache, static_checks=False), task, "allocator pinned")
    spread(EvalConfig(cache_dir=cache, static_checks=False, sandbox=SandboxConfig(pin_allocator=False)), task,
           "glibc adaptive mmap")
    return 0


if __name__ == "__main__":
    sys.exit(main())
