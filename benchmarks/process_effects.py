"""Per-process timing effects: identical programs in several processes, interleaved.

Starts P worker-like processes with the judge's worker environment (threads, allocator settings),
each running a built-in task's reference at the `small` size on fresh scaled copies of its own
input pool, after a cache eviction, k calls per sample. The driver asks each process for one
sample per round, in a fresh random order, for R rounds, and prints each process's median against
the median of all, with the medians of odd and even rounds apart: when the two halves agree, the
process itself (not the noise) is faster or slower. This is the floor under any A/A check that
times identical code in different processes (`kernelrl calibrate`).

`--spacer` allocates a block of random size before each sample's inputs, moving where the inputs
and outputs land in the heap from one sample to the next; `--no-aslr` starts the processes under
`setarch -R`. Both are diagnostics: they show whether a process's layout is what makes it faster.
`--pin CPU` binds every process to that one core (and the driver to the others), removing which
core a process happens to be woken on. `--fork-shared` removes everything but the process itself:
one interpreter loads the task, puts its model's parameters, the input pool and the eviction
buffer in shared memory, and forks the P processes, which then run on the very same physical
pages at the very same addresses, with the same code; whatever still differs between them is
the process (its page tables and whatever the machine keeps per address space).

Usage: python benchmarks/process_effects.py level1/gelu [--procs 6] [--rounds 300] [--calls 2]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

from kernelrl.judge.isolation.sandbox import SandboxConfig, worker_env

WORKER = r"""
import os, random, sys, time, torch
from kernelrl.tasks.sizes import instantiate
from kernelrl.tasks.suites import builtin_task
if sys.argv[3] != "-1":
    os.sched_setaffinity(0, {int(sys.argv[3])})
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
task = instantiate(builtin_task(sys.argv[1]), "small")
torch.manual_seed(0)
model = task.Model(*task.get_init_inputs())
pool = [task.get_inputs() for _ in range(3)]
evict = torch.zeros(16 << 20)
spacer = sys.argv[2] == "1"
rng = random.Random(int.from_bytes(os.urandom(4), "little"))
for line in sys.stdin:
    k = int(line)
    pad = torch.empty(rng.randrange(1, 1 << 20)) if spacer else None
    inputs = [[x * (1.0 + 0.001 * rng.random()) if x.is_floating_point() else x for x in pool[rng.randrange(3)]]
              for _ in range(k)]
    evict.add_(1.0)
    total = 0
    with torch.no_grad():
        for args in inputs:
            t0 = time.perf_counter_ns()
            out = model(*args)
            total += time.perf_counter_ns() - t0
    del inputs, out, pad
    print(total, flush=True)
"""


FORK_SHARED = r"""
import os, random, statistics, sys, time, torch
from kernelrl.tasks.sizes import instantiate
from kernelrl.tasks.suites import builtin_task
task_name, procs, rounds, calls, pin = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
task = instantiate(builtin_task(task_name), "small")
torch.manual_seed(0)
model = task.Model(*task.get_init_inputs())
for p in model.parameters():
    p.data.share_memory_()
pool = [[x.share_memory_() for x in task.get_inputs()] for _ in range(3)]
evict = torch.zeros(16 << 20).share_memory_()
kids = []
for _ in range(procs):
    r1, w1 = os.pipe(); r2, w2 = os.pipe()
    if os.fork() == 0:
        if pin != -1:
            os.sched_setaffinity(0, {pin})
        rf, wf = os.fdopen(r1), os.fdopen(w2, "w")
        for line in rf:
            if int(line) < 0:
                break
            args = pool[int(line)]
            evict.add_(1.0)
            total = 0
            with torch.no_grad():
                for _ in range(calls):
                    t0 = time.perf_counter_ns()
                    model(*args)
                    total += time.perf_counter_ns() - t0
            wf.write(f"{total}\n"); wf.flush()
        os._exit(0)
    kids.append((os.fdopen(w1, "w"), os.fdopen(r2)))
times = [[] for _ in kids]
for _ in range(rounds):
    order = list(range(procs)); random.shuffle(order)
    k = random.randrange(3)
    for i in order:
        kids[i][0].write(f"{k}\n"); kids[i][0].flush()
        times[i].append(int(kids[i][1].readline()))
for w, _ in kids:  # a child holds its siblings' pipes too: it is told to stop, not left for EOF
    w.write("-1\n"); w.flush()
for _ in kids:
    os.wait()
for t in times:
    print(" ".join(map(str, t)))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task")
    parser.add_argument("--procs", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--calls", type=int, default=2, help="calls per sample")
    parser.add_argument("--spacer", action="store_true")
    parser.add_argument("--no-aslr", action="store_true")
    parser.add_argument("--pin", type=int, default=-1, metavar="CPU", help="bind every process to this core")
    parser.add_argument("--fork-shared", action="store_true",
                        help="fork the processes from one that holds the model, inputs and eviction buffer "
                             "in shared memory")
    args = parser.parse_args()
    if args.procs < 2 or args.rounds < 10 or args.calls < 1:
        parser.error("need --procs >= 2, --rounds >= 10, --calls >= 1")

    cores = os.sched_getaffinity(0)
    if args.pin != -1:
        if args.pin not in cores or len(cores) < 2:
            parser.error(f"--pin needs one of this process's cores {sorted(cores)}, and at least two of them")
        os.sched_setaffinity(0, cores - {args.pin})
    workdir = Path(tempfile.mkdtemp(prefix="kernelrl-proc-effects-"))
    env = worker_env(SandboxConfig(), workdir)
    prefix = ["setarch", os.uname().machine, "-R"] if args.no_aslr else []
    if args.fork_shared:
        done = subprocess.run([*prefix, sys.executable, "-c", FORK_SHARED, args.task, str(args.procs), str(args.rounds),
                               str(args.calls), str(args.pin)], capture_output=True, text=True, env=env, cwd=workdir)
        if done.returncode:
            raise SystemExit(f"the forking process failed:\n{done.stderr[-2000:]}")
        times = [[int(v) for v in line.split()] for line in done.stdout.splitlines() if line.strip()]
    else:
        times = _spawned(args, env, workdir, prefix)

    meds = [statistics.median(t) for t in times]
    whole = statistics.median(meds)
    kind = " forked (shared memory)" if args.fork_shared else ""
    print(f"{args.task}: {args.procs}{kind} processes x {args.rounds} rounds, {args.calls} calls per sample, "
          f"{env['OMP_NUM_THREADS']} threads, median call {whole / args.calls / 1e6:.3f} ms"
          + (", spacer" if args.spacer else "") + (", no ASLR" if args.no_aslr else "")
          + (f", pinned to core {args.pin}" if args.pin != -1 else ""))
    print("  per process, median / all (odd rounds / even rounds):")
    for t, m in zip(times, meds):
        print(f"    {m / whole:.3f}  ({statistics.median(t[1::2]) / whole:.3f} / {statistics.median(t[0::2]) / whole:.3f})")
    print(f"  spread of process medians: {(max(meds) - min(meds)) / whole * 100:.1f} %")
    return 0


def _pipes(proc: subprocess.Popen[str]) -> tuple[IO[str], IO[str]]:
    """A worker's stdin and stdout (it is started with both piped)."""
    if proc.stdin is None or proc.stdout is None:
        raise RuntimeError("worker process started without its pipes")
    return proc.stdin, proc.stdout


def _spawned(args: argparse.Namespace, env: dict[str, str], workdir: Path, prefix: list[str]) -> list[list[int]]:
    """Per process, its sample times: P fresh interpreters, asked in a random order each round."""
    cmd = [*prefix, sys.executable, "-c", WORKER, args.task, "1" if args.spacer else "0", str(args.pin)]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=workdir)
             for _ in range(args.procs)]
    times: list[list[int]] = [[] for _ in procs]
    try:
        for _ in range(args.rounds):
            order = list(range(len(procs)))
            random.shuffle(order)
            for i in order:
                stdin, stdout = _pipes(procs[i])
                stdin.write(f"{args.calls}\n")
                stdin.flush()
                line = stdout.readline()
                if not line:
                    raise SystemExit(f"process {i} exited (code {procs[i].wait()})")
                times[i].append(int(line))
    finally:
        for p in procs:
            _pipes(p)[0].close()
            p.wait()
    return times


if __name__ == "__main__":
    sys.exit(main())
