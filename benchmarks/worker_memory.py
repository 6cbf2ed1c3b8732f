"""Peak host memory of every process of one evaluation of a level-1-like elementwise task, at a size
chosen on the command line (issue 31, item 1).

The task is KernelBench's level-1 elementwise shape scaled down (`--mib` per tensor: KernelBench's
4096 x 393216 fp32 is 6144 MiB), judged with one correct candidate (the reference's own code) under
the evaluator's defaults. A thread samples VmRSS of every process below this one every 20 ms; at
the end it prints each process's peak, the judge's own peak, and the size of one input set (input
plus output), so a worker's peak can be read in sets; then, for each busy process, its peak within
each of the group's phases (`EvalResult.environment.phases`, laid end to end from the start of the
evaluation), so the step that sets the peak is named.

Peaks are VmRSS and, beside it, what the kernel cannot drop (RssAnon + RssShmem): the judge keeps
large sets in files (`EvalConfig.spill_set_mib`, `--spill-mib none` to keep them in its heap), whose
pages count in VmRSS but are page cache.

`--task FILE` judges a task file of the user's instead (a KernelBench level-1 file, at its own
full size), one set being its inputs and outputs as sized on the meta device. It first runs the
task bare, once, in a process of its own (torch, the inputs, one forward pass: what the program
itself needs, its temporaries included), so the judge's workers can be read against that.

Usage: python benchmarks/worker_memory.py [--mib 256 | --task FILE] [--sets 5] [--rewrite] [--spill-mib 64|none]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import machine

from kernelrl.judge.eval_config import TimingConfig
from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.judge.harness.procfs import descendants
from kernelrl.tasks.task import Size, load_task_file

TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """GELU (tanh form), elementwise, level 1 style."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")


batch_size = 4096
dim = {dim}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''


# The task run bare: its held memory after importing torch, then one forward pass on its inputs.
BARE = """
import importlib.util, sys, torch
def held():
    f = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
    return sum(int(f[k].split()[0]) for k in ("RssAnon", "RssShmem"))
print("torch", held(), flush=True)
spec = importlib.util.spec_from_file_location("task", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
torch.manual_seed(0)
model = m.Model(*m.get_init_inputs())
inputs = m.get_inputs()
with torch.no_grad():
    out = model(*inputs)
print("ran", held(), flush=True)
del model, inputs, out  # freed before the sizing's imports, which are not the program's
from kernelrl.judge.harness.profile import profile_task  # one set's size as the judge sizes it (meta device)
p = profile_task(m, task="t", size="full", constants={}, init_inputs=m.get_init_inputs(),
                 source=open(sys.argv[1]).read())
print("set", p.input_bytes + p.output_bytes, flush=True)
"""


def rss_kib(pid: int) -> tuple[int, int, int]:
    """VmRSS, RssAnon (the heap) and RssShmem (shared memory: the arenas), in KiB. The last two are
    what the kernel cannot drop; the rest is file pages, such as the judge's sets kept in files."""
    fields: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "RssAnon:", "RssShmem:")):
                fields[line.split(":")[0]] = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return fields.get("VmRSS", 0), fields.get("RssAnon", 0), fields.get("RssShmem", 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="MiB per tensor (input and output alike)")
    ap.add_argument("--task", type=Path, help="a task file (KernelBench format) judged at its own full size "
                                              "instead of the GELU")
    ap.add_argument("--sets", type=int, default=5, help="correctness input sets")
    ap.add_argument("--rewrite", action="store_true",
                    help="judge GELU written out (x/2 (1 + tanh(...))): right within the tolerance but not "
                         "bitwise, so every comparison measures its errors (the reference's own code matches "
                         "bitwise and is compared without them)")
    ap.add_argument("--spill-mib", default="64",
                    help="EvalConfig.spill_set_mib: sets of this many MiB or more kept by the judge in files; "
                         "'none' keeps them in its heap")
    args = ap.parse_args()
    spill_mib = None if args.spill_mib == "none" else int(args.spill_mib)
    print(machine.header("cpu"))
    dim = args.mib * (1 << 20) // 4 // 4096
    if args.task is not None:
        path, constants = args.task, {}
        one_set_mib = 0.0  # from the bare run, below
    else:
        folder = Path(tempfile.mkdtemp(prefix="worker-memory-"))
        path, constants = folder / "gelu_big.py", {"dim": dim}
        path.write_text(TASK.format(dim=dim))
        one_set_mib = 2 * args.mib
    task = load_task_file(path)
    peaks: dict[int, int] = {}
    held_peaks: dict[int, int] = {}
    parts_at_peak: dict[int, tuple[int, int]] = {}  # pid -> (heap, shared) when its held memory peaked
    series: dict[int, list[tuple[float, int]]] = {}  # pid -> (seconds since the start, KiB held)
    done = threading.Event()

    def sample() -> None:
        me = os.getpid()
        while not done.is_set():
            now = time.monotonic() - t0
            for pid in [me, *descendants(me, depth=8)]:
                kib, anon, shmem = rss_kib(pid)
                peaks[pid] = max(peaks.get(pid, 0), kib)
                if anon + shmem > held_peaks.get(pid, -1):
                    held_peaks[pid], parts_at_peak[pid] = anon + shmem, (anon, shmem)
                series.setdefault(pid, []).append((now, anon + shmem))
            time.sleep(0.02)

    t0 = time.monotonic()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    if args.task is not None:
        bare = subprocess.run([sys.executable, "-c", BARE, str(path)], capture_output=True, text=True, check=True)
        said = dict(line.split() for line in bare.stdout.splitlines())
        one_set_mib = int(said["set"]) / (1 << 20)
        time.sleep(0.1)
        bare_peak = max((held for pid, held in held_peaks.items() if pid != os.getpid()), default=0)
        print(f"the task run bare (one forward pass, its own process): held {bare_peak / 1024:.0f} MiB at its peak "
              f"(sampled), {int(said['ran']) / 1024:.0f} MiB after the pass, {int(said['torch']) / 1024:.0f} MiB "
              f"of it torch alone; one set {one_set_mib:.0f} MiB")
        held_peaks.clear()
        peaks.clear()
        series.clear()
        parts_at_peak.clear()
    config = EvalConfig(size=Size.FULL, n_correctness=args.sets, constants=constants, timeout_s=600,
                        timing=TimingConfig(min_rounds=5, max_rounds=20, max_timing_s=5.0, warmup_calls=2,
                                            min_spot_checks=2), spill_set_mib=spill_mib)
    with Evaluator(config) as ev:
        started = time.monotonic() - t0
        source = re.sub(r"\bModel\b", "ModelNew", task.source)  # `super(Model, self)` too
        if args.rewrite:
            source = source.replace('return torch.nn.functional.gelu(x, approximate="tanh")',
                                    "return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))")
        result = ev.evaluate(task, source)
    done.set()
    sampler.join()
    shape = (f"{path.name} at full size" if args.task is not None
             else f"4096 x {dim} fp32 ({args.mib} MiB a tensor")
    print(f"task: {shape}; one set, inputs and outputs: {one_set_mib:.0f} MiB); "
          f"{args.sets} sets; verdict {result.status.value} {result.message!r}; {time.monotonic() - t0:.0f} s")
    me = os.getpid()
    ref = result.environment.reference
    print(f"spill_set_mib {spill_mib}: sets the judge kept in files {ref.sets_in_files if ref else '?'}")
    timing = result.environment.timing
    if timing is not None:  # a sample of k calls stages k inputs in each timed worker: its peak grows with k
        print(f"timing: {timing.rounds} rounds, {timing.calls_per_sample} call(s) per sample")
    print(f"judge process peak RSS: {peaks.get(me, 0) / 1024:.0f} MiB; held (heap and shared memory, not file "
          f"pages): {held_peaks.get(me, 0) / 1024:.0f} MiB = {held_peaks.get(me, 0) / 1024 / one_set_mib:.2f} sets "
          f"(heap {parts_at_peak.get(me, (0, 0))[0] / 1024:.0f}, shared {parts_at_peak.get(me, (0, 0))[1] / 1024:.0f})")
    workers = sorted((pid for pid, kib in peaks.items() if pid != me and kib > 200 * 1024), key=lambda p: -peaks[p])
    for pid in workers:
        kib, held = peaks[pid], held_peaks.get(pid, 0)
        print(f"  process peak RSS: {kib / 1024:7.0f} MiB = {kib / 1024 / one_set_mib:5.2f} sets; "
              f"held {held / 1024:7.0f} MiB (heap {parts_at_peak[pid][0] / 1024:.0f}, "
              f"shared {parts_at_peak[pid][1] / 1024:.0f})")
    phases = result.environment.phases
    if phases is not None:
        edges, at = [], started
        for name in ("reference_load_s", "reference_outputs_s", "candidate_checks_s", "timing_pool_s", "timing_s"):
            edges.append((name.removesuffix("_s"), at, at + getattr(phases, name)))
            at += getattr(phases, name)
        spans = ", ".join(f"{n} {a:.1f}-{b:.1f} s" for n, a, b in edges)
        print(f"held memory's peak in each phase (MiB), processes by peak: {spans}")
        busy = sorted((pid for pid, kib in peaks.items() if kib > 200 * 1024), key=lambda pid: -peaks[pid])
        for pid in busy:
            row = [max((kib for t, kib in series.get(pid, []) if a <= t < b), default=0) / 1024 for _, a, b in edges]
            who = "judge" if pid == me else "worker"
            print(f"  {who:6} {peaks[pid] / 1024:6.0f}: " + "  ".join(f"{n} {v:5.0f}" for (n, _, _), v in zip(edges, row)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
