"""KernelBench samples judged on a device: baselines, the shipped examples, replayed candidates (issue 25, item 5).

From a KernelBench checkout the user names (never shipped with kernelrl), a seeded sample of
`--sample` tasks per level (levels 1 and 2 by default). Prints:
- per sampled task, the reference's eager and torch.compile times (`Evaluator.baseline`,
  interleaved in one measurement);
- kernelrl's shipped examples for the device (`kernelrl/examples`, on their built-in tasks; on a
  CPU the Triton ones run under the interpreter: correctness only), each with its verdict and
  speedup against its declared verdict;
- with `--replay FILE` (rows `{"task": NAME, "code": ...}`, as `replay:` proposers read), every
  row whose task is in the sample (by full name or last path component), judged in one batch;
- per group: verdict counts, fast_0 and fast_1 (share correct, share correct and faster than
  eager), and the geometric mean of correct speedups against eager and against torch.compile
  (speedup x compile/eager of the task's baseline, measured in its own group).

Usage: python benchmarks/kernelbench_gpu.py KERNELBENCH [--device cuda] [--size full] [--sample 20]
       [--levels 1 2] [--seed 0] [--replay FILE] [--no-compile] [--no-examples] [--json OUT]
Tiny CPU check: python benchmarks/kernelbench_gpu.py KERNELBENCH --device cpu --size small --sample 1
       --no-compile --examples-limit 1 --quick
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

from kernelrl.candidate import Candidate, Language
from kernelrl.examples import list_examples
from kernelrl.judge.eval_config import TimingConfig
from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.judge.reference import ReferenceFailed
from kernelrl.judge.timing.baseline import Baseline
from kernelrl.report.metrics import fast_p, geometric_mean
from kernelrl.result import EvalResult, Status
from kernelrl.reward import within_noise
from kernelrl.tasks.suites import builtin_task
from kernelrl.tasks.task import Task, TaskError, load_task_dir


def sample_tasks(root: Path, levels: list[int], per_level: int, seed: int) -> list[Task]:
    tasks = load_task_dir(root)
    rng = random.Random(seed)
    out = []
    for level in levels:
        pool = sorted((t for t in tasks if t.level == level), key=lambda t: t.name)
        out += sorted(rng.sample(pool, min(per_level, len(pool))), key=lambda t: t.name)
    return out


def replay_rows(path: Path, tasks: list[Task]) -> list[tuple[Task, Candidate]]:
    by_name = {t.name: t for t in tasks} | {t.name.rsplit("/", 1)[-1]: t for t in tasks}
    out = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        task = by_name.get(str(row.get("task", "")))
        if task is not None and isinstance(row.get("code"), str):
            out.append((task, Candidate(source=row["code"], origin=f"{path.name}:{i + 1}")))
    return out


def summary(label: str, results: list[EvalResult], ratio: dict[str, float]) -> dict[str, Any]:
    speedups = [r.speedup if r.status is Status.CORRECT else None for r in results]
    noisy = [within_noise(r) for r in results]
    timed = [s for s in speedups if s is not None]
    vs_compile = [r.speedup * ratio[r.task] for r in results if r.speedup is not None and r.task in ratio]
    row = {"group": label, "n": len(results), "verdicts": dict(Counter(r.status.value for r in results)),
           "fast_0": fast_p(speedups, 0.0, within_noise=noisy), "fast_1": fast_p(speedups, 1.0, within_noise=noisy),
           "geomean_vs_eager": geometric_mean(timed), "geomean_vs_compile": geometric_mean(vs_compile),
           "interpreted": sum(r.timing.value == "interpreted" for r in results)}
    geo = row["geomean_vs_eager"]
    geo_c = row["geomean_vs_compile"]
    print(f"  {label}: n={row['n']} {row['verdicts']} fast_0 {row['fast_0']:.2f} fast_1 {row['fast_1']:.2f} "
          f"geomean vs eager {geo if geo is None else f'{geo:.3f}'} vs compile "
          f"{geo_c if geo_c is None else f'{geo_c:.3f}'}"
          + (f" ({row['interpreted']} interpreted: not timed)" if row["interpreted"] else ""))
    return row


def print_result(name: str, r: EvalResult, expected: str = "") -> None:
    speed = f"{r.speedup:8.3f}x" if r.speedup is not None else f"{'-':>9s}"
    mark = "" if not expected else ("  as declared" if r.status.value == expected else f"  DECLARED {expected}")
    print(f"  {name:48s} {r.status.value:14s} {speed}  {r.message[:70]}{mark}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernelbench", type=Path, help="a KernelBench checkout (the user's own)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--size", choices=("small", "full"), default="full")
    parser.add_argument("--sample", type=int, default=20, help="tasks per level")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay", type=Path, default=None)
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile baseline")
    parser.add_argument("--no-examples", action="store_true")
    parser.add_argument("--examples-limit", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="short timing (a smoke test, not a measurement)")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--concurrency", type=int, default=2,
                        help="candidates built and checked at once (timing never overlaps on a device)")
    parser.add_argument("--json", type=Path, default=None, help="write every row here")
    args = parser.parse_args()
    try:
        tasks = sample_tasks(args.kernelbench, args.levels, args.sample, args.seed)
    except TaskError as err:
        parser.error(str(err))
    if not tasks:
        parser.error(f"no level {args.levels} tasks under {args.kernelbench}")
    timing = TimingConfig(min_rounds=5, max_rounds=20, max_timing_s=2.0) if args.quick else TimingConfig()
    extra = {"cache_dir": args.cache_dir} if args.cache_dir else {}
    config = EvalConfig(device=args.device, size=args.size, timing=timing, concurrency=args.concurrency, **extra)
    print(machine.header(args.device))
    print(f"# command: {' '.join(sys.argv)}")
    out: dict[str, Any] = {"machine": machine.describe(args.device), "baselines": [], "examples": [], "replay": [],
                           "summary": []}
    ratio: dict[str, float] = {}  # task -> compile_ms / eager_ms
    t0 = time.monotonic()
    with Evaluator(config) as ev:
        print(f"\n== baselines: {len(tasks)} tasks (levels {args.levels}, seed {args.seed}), judged as one batch")
        lock = threading.Lock()

        def baseline(i: int, b: Baseline | ReferenceFailed) -> None:  # as each task's group closes
            task = tasks[i]
            with lock:
                if isinstance(b, ReferenceFailed):
                    print(f"  {task.name:48s} reference failed: {str(b).splitlines()[0][:80]}", flush=True)
                    out["baselines"].append({"task": task.name, "error": str(b).splitlines()[0]})
                    return
                if b.compile_ms:
                    ratio[task.name] = b.compile_ms / b.eager_ms
                compiled = f"{b.compile_ms:10.4f}" if b.compile_ms else f"{'-':>10s}"
                print(f"  {task.name:48s} eager {b.eager_ms:10.4f} ms  compile {compiled} ms  "
                      f"{time.monotonic() - t0:5.0f} s  {b.compile_error[:60]}", flush=True)
                out["baselines"].append({"task": task.name, "eager_ms": b.eager_ms, "compile_ms": b.compile_ms,
                                         "compile_error": b.compile_error, "elapsed_s": time.monotonic() - t0})
                if args.json:  # written as each row lands: a step cut by its limit keeps what it measured
                    args.json.write_text(json.dumps(out, indent=1, default=str))

        ev.baselines(tasks, compile=not args.no_compile, on_result=baseline)
        if not args.no_examples:
            examples = list_examples(device=args.device)
            if args.device == "cpu":  # Triton runs on a CPU too, under its interpreter
                examples += [e for e in list_examples(device="cuda")
                             if Candidate(source=e.source).language is Language.TRITON]
            examples = examples[: args.examples_limit]
            print(f"\n== shipped examples ({args.device}): {len(examples)}")
            got = ev.evaluate_batch([(builtin_task(e.task), Candidate(source=e.source, origin=e.name))
                                     for e in examples])
            for e, r in zip(examples, got):
                print_result(e.name, r, e.expected)
                out["examples"].append({"name": e.name, "expected": e.expected, **r.to_dict()})
            out["summary"].append(summary("examples", got, ratio))
        if args.replay:
            rows = replay_rows(args.replay, tasks)
            print(f"\n== replay {args.replay.name}: {len(rows)} candidates for sampled tasks")
            got = ev.evaluate_batch(rows)
            for (task, cand), r in zip(rows, got):
                print_result(f"{task.name} ({cand.origin})", r)
                out["replay"].append({"origin": cand.origin, **r.to_dict()})
            out["summary"].append(summary("replay", got, ratio))
    print(f"\n{time.monotonic() - t0:.0f} s in all")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
