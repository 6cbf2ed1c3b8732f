"""KernelBench references at kernelrl's `small` preset: how many run in under a second on a CPU.

For each level 1-3 task of a KernelBench checkout, in a fresh subprocess with an address-space
limit (RLIMIT_AS, 8 GiB by default) and one torch thread: resolve the `small` constants, run the
task's module with them, build the model from its init inputs, make inputs and run one forward
under `torch.no_grad()`. A task's time is instantiate (module, model, inputs) + forward; the
forward alone and the time spent resolving the constants (the shrink, on the meta device) are
recorded beside it.

Prints the count of tasks under the threshold (1 s), the failures with their first error line,
and the slow ones with their times; `--json` writes one row per task.

Usage: python benchmarks/kernelbench_small.py /path/to/KernelBench [--jobs 1] [--timeout 120]
       [--levels 1 2 3] [--json rows.json] [--only level1/100_HingeLoss ...]
Times depend on the machine and its load; run with one or two jobs on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kernelrl.tasks.task import load_task_dir


def run_one(path: str, name: str, level: int, limit_bytes: int) -> dict[str, Any]:
    """Child process: one task at `small`; returns its row. Every failure becomes the row's error."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    import torch

    from kernelrl.tasks.sizes import resolve_constants
    from kernelrl.tasks.task import exec_task_module, load_task_file

    torch.set_num_threads(1)
    row: dict[str, Any] = {"task": name}
    phase = "load"
    try:
        task = load_task_file(Path(path), name=name, level=level)
        phase = "resolve"
        t0 = time.perf_counter()
        consts = resolve_constants(task, "small")
        row["resolve_s"] = time.perf_counter() - t0
        row["constants"] = consts
        changed = {k: v for k, v in consts.items() if task.constants().get(k) != v}
        row["shrunk"] = changed
        phase = "instantiate"
        torch.manual_seed(0)
        t1 = time.perf_counter()
        tm = exec_task_module(task, consts)  # the module run with the resolved constants
        model = tm.Model(*tm.get_init_inputs()).eval()
        inputs = tm.get_inputs()
        t2 = time.perf_counter()
        phase = "forward"
        with torch.no_grad():
            model(*inputs)
        t3 = time.perf_counter()
        row.update(instantiate_s=t2 - t1, forward_s=t3 - t2, total_s=t3 - t1)
    except BaseException as e:  # noqa: BLE001 - MemoryError, SystemExit from task code: all are the row's
        msg = str(e).strip().splitlines()
        row["error"] = f"{phase}: {type(e).__name__}: {msg[0] if msg else ''}"[:300]
    return row


def measure(path: Path, name: str, level: int, *, limit_gib: float, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", str(path), name, str(level), str(int(limit_gib * (1 << 30)))]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        return {"task": name, "error": f"timeout: no result within {timeout:.0f} s"}
    wall = time.perf_counter() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return {"task": name, "error": f"crash: {tail[:300]}", "process_s": wall}
    row = json.loads(lines[-1])
    row["process_s"] = wall
    return row


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, path, name, level, limit = sys.argv
        print(json.dumps(run_one(path, name, int(level), int(limit))), flush=True)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", type=Path, help="a KernelBench checkout (or its KernelBench/ folder)")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--only", nargs="*", default=None, help="task names (level1/100_HingeLoss) to run")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per task, whole process")
    ap.add_argument("--limit-gib", type=float, default=8.0, help="address-space limit per task")
    ap.add_argument("--threshold", type=float, default=1.0, help="seconds: instantiate + forward")
    ap.add_argument("--json", type=Path, default=None, help="write per-task rows here")
    args = ap.parse_args()

    tasks = [t for t in load_task_dir(args.checkout) if t.level in args.levels]
    if args.only:
        tasks = [t for t in tasks if t.name in set(args.only)]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(pool.map(lambda t: measure(t.path, t.name, t.level, limit_gib=args.limit_gib,
                                               timeout=args.timeout), tasks))
    elapsed = time.perf_counter() - start

    failed = [r for r in rows if "error" in r]
    ok = [r for r in rows if "error" not in r]
    fast = [r for r in ok if r["total_s"] < args.threshold]
    slow = sorted((r for r in ok if r["total_s"] >= args.threshold), key=lambda r: -r["total_s"])
    print(f"KernelBench levels {' '.join(map(str, args.levels))} at small ({args.checkout}): "
          f"{len(fast)} of {len(rows)} run in under {args.threshold:g} s "
          f"(instantiate + forward, 1 thread, {args.limit_gib:g} GiB address space); "
          f"{len(failed)} fail, {len(slow)} slow; {elapsed:.0f} s in all")
    if failed:
        print("\nfailures:")
        for r in failed:
            print(f"  {r['task']}: {r['error']}")
    if slow:
        print("\nslow (total = instantiate + forward):")
        for r in slow:
            print(f"  {r['task']}: total {r['total_s']:.2f} s, forward {r['forward_s']:.2f} s, "
                  f"shrunk {r.get('shrunk') or '{}'}")
    if ok:
        resolve = sorted(r["resolve_s"] for r in ok)
        print(f"\nresolving small constants (meta device): median {resolve[len(resolve) // 2]:.2f} s, "
              f"max {resolve[-1]:.2f} s ({max(ok, key=lambda r: r['resolve_s'])['task']})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
        print(f"rows written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
