"""CUDA-L1's published kernels re-timed by kernelrl, side by side with their published speedups (issue 25, item 6).

Reads the user's own copy of CUDA-L1's published kernels (never shipped with kernelrl), in any
layout `kernelrl audit` reads (`kernelrl.checks.audit.read_entries`: a JSON dict of levels of
entries with `task_id`, `ref_code` and `custom_code`, JSON Lines, or a folder). Takes a seeded
sample of the entries that have code and a task, judges them in one batch, and prints per
kernel: the published speedup (the first of `--speedup-key` found among the entry's fields), the
verdict, kernelrl's speedup and the ratio of the two, and for a refused kernel the rules that
refused it (or the first line of why it failed). Ends with counts of verdicts and refusing
rules, and the geometric means of both speedups over the kernels kernelrl found correct.

Usage: python benchmarks/cuda_l1_retime.py PATH [--device cuda] [--size full] [--sample 30] [--seed 0]
       [--speedup-key speedup score ...] [--only 'level2/*'] [--policy open] [--json OUT]
Tiny CPU check: python benchmarks/cuda_l1_retime.py FILE --device cpu --size small --sample 2 --quick
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import machine

from kernelrl.candidate import Candidate
from kernelrl.checks.audit import AuditEntry, AuditInputError, read_entries, select
from kernelrl.judge.eval_config import TimingConfig
from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.report.metrics import geometric_mean
from kernelrl.result import EvalResult, Severity, Status
from kernelrl.tasks.task import Task

# `score_default` is the published files' field (optimized_cuda_code/h100.json: JSON Lines, speedup over
# eager); their codes/ files carry `score` as text.
SPEEDUP_KEYS = ("score_default", "speedup", "speedup_ratio", "score", "mean_speedup", "speedup_vs_ref")


def published_speedup(entry: AuditEntry, keys: list[str]) -> float | None:
    for key in keys:
        value = entry.meta.get(key)
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return None


def why(r: EvalResult) -> str:
    rules = sorted({f.rule for f in r.findings if f.severity is Severity.REJECT})
    if r.status is Status.FLAGGED and rules:
        return ", ".join(rules)
    return "" if r.status is Status.CORRECT else r.message.splitlines()[0][:80] if r.message else ""


def _item(entry: AuditEntry) -> tuple[Task, Candidate]:
    """The (task, candidate) pair to judge for an entry that has both."""
    if entry.task is None:
        raise ValueError(f"{entry.name}: entry has no task")  # `main` keeps only entries with one
    return entry.task, Candidate(source=entry.code or "", origin=entry.name)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="the user's copy of CUDA-L1's published kernels")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--size", choices=("small", "full"), default="full")
    parser.add_argument("--sample", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speedup-key", nargs="+", default=list(SPEEDUP_KEYS),
                        help="entry fields holding the published speedup, first found wins")
    parser.add_argument("--only", nargs="+", default=None, help="entry names or patterns (level2/*)")
    parser.add_argument("--policy", choices=("open", "strict", "observe"), default="open")
    parser.add_argument("--quick", action="store_true", help="short timing (a smoke test, not a measurement)")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--concurrency", type=int, default=2,
                        help="candidates built and checked at once (timing never overlaps on a device)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    try:
        entries = select(read_entries(args.path), only=args.only)
    except AuditInputError as err:
        parser.error(str(err))
    usable = [e for e in entries if e.code and e.task is not None]
    rng = random.Random(args.seed)
    chosen = sorted(rng.sample(usable, min(args.sample, len(usable))), key=lambda e: e.name)
    if not chosen:
        parser.error(f"no entry with code and a task in {args.path} ({len(entries)} entries)")
    timing = TimingConfig(min_rounds=5, max_rounds=20, max_timing_s=2.0) if args.quick else TimingConfig()
    extra = {"cache_dir": args.cache_dir} if args.cache_dir else {}
    config = EvalConfig(device=args.device, size=args.size, policy=args.policy, timing=timing,
                        concurrency=args.concurrency, **extra)
    print(machine.header(args.device))
    print(f"# command: {' '.join(sys.argv)}")
    print(f"# {len(chosen)} of {len(usable)} usable entries ({len(entries)} read), seed {args.seed}\n")
    t0 = time.monotonic()
    print(f"{'kernel':28s} {'published':>10s} {'kernelrl':>10s} {'ratio':>7s}  {'verdict':14s} why", flush=True)
    guard = threading.Lock()
    landed: list[dict[str, Any]] = []

    def line(i: int, r: EvalResult) -> None:
        # Each row as its group ends, so a run stopped by a time limit keeps the rows it finished.
        e = chosen[i]
        pub = published_speedup(e, args.speedup_key)
        ratio = r.speedup / pub if r.speedup is not None and pub else None
        with guard:
            print(f"{e.name:28s} {_num(pub):>10s} {_num(r.speedup):>10s} {_num(ratio):>7s}  {r.status.value:14s} "
                  f"{why(r)}  ({time.monotonic() - t0:.0f} s)", flush=True)
            if r.environment.phases is not None:
                print(f"    phases (s): {r.environment.phases.describe()}", flush=True)
            if args.json:  # written as each row lands: a run stopped by a time limit keeps its rows
                landed.append({"name": e.name, "published_speedup": pub, "elapsed_s": time.monotonic() - t0,
                               **r.to_dict()})
                args.json.write_text(json.dumps({"machine": machine.describe(args.device), "rows": landed},
                                                indent=1, default=str))

    with Evaluator(config) as ev:
        results = ev.evaluate_batch([_item(e) for e in chosen], on_result=line)
    rows: list[dict[str, Any]] = []
    both: list[tuple[float, float]] = []
    for e, r in zip(chosen, results):
        pub = published_speedup(e, args.speedup_key)
        if r.speedup is not None and pub:
            both.append((pub, r.speedup))
        rows.append({"name": e.name, "published_speedup": pub, **r.to_dict()})
    rules = Counter(rule for r in results for rule in {f.rule for f in r.findings if f.severity is Severity.REJECT})
    print(f"\nverdicts: {dict(Counter(r.status.value for r in results))}; refusing rules: {dict(rules)}")
    if both:
        print(f"over {len(both)} kernels correct here with a published speedup: geomean published "
              f"{geometric_mean([p for p, _ in both]):.3f}, kernelrl {geometric_mean([k for _, k in both]):.3f}")
    print(f"{time.monotonic() - t0:.0f} s in all")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine.describe(args.device), "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
