"""What a worker sets on itself at start-up, from the environment the judge gave it, before it says
hello: the allocator's pinned settings, transparent huge pages off, and its limits.

Guarantees: `set_own_limits` only lowers limits (no privilege needed, whatever the worker's uid),
and the judge reads the process limit back from /proc rather than taking the worker's word.
Does not choose any value: the judge does (`kernelrl.judge.sandbox`). Imports nothing of torch or
of the judge, so a worker reads it before importing torch.
"""

from __future__ import annotations

import os
import resource

# glibc reads these at start-up. Every allocation comes from the heap, never from mmap, and freed
# memory stays there: a tensor of 32 MiB or more (glibc's largest mmap threshold) was otherwise
# mapped afresh, and its pages faulted in and zeroed, on every call in one process, but carved
# from free heap in another, depending on each process's history; identical code measured up to
# 1.7x apart between two processes (benchmarks/README.md, timing noise). A fixed threshold also
# turns off the adaptive one that made large-tensor timings swing up to 3x.
#
# Carved from the heap, a tensor lands wherever the process's history left free space, so the
# distance between a call's input and its output, modulo 4 KiB, differed from process to process;
# an output starting 64-256 bytes past its input (modulo 4 KiB) made loads wait on unrelated
# stores (4K aliasing): GELU on 4 MiB ran 10 % slower at 64 bytes than at 0, in one process
# (benchmarks/README.md, timing noise). Torch's THP allocation setting starts every tensor of
# 2 MiB or more on a page boundary, so every such input and output pair is 0 apart modulo 4 KiB in
# every process; the worker turns transparent huge pages off for itself (`NO_HUGE_PAGES_ENV`), so
# whether a tensor happens to span an aligned 2 MiB extent cannot make it faster either.
PINNED_ALLOCATOR_ENV = {
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
    "MALLOC_TOP_PAD_": str(64 << 20),
    "THP_MEM_ALLOC_ENABLE": "1",
}
# Read by the worker at start-up: no transparent huge pages in this process (prctl).
NO_HUGE_PAGES_ENV = "KERNELRL_NO_HUGE_PAGES"
# Read by the worker at start-up: limits it sets on itself before it says hello ("nofile=4096,nproc=272").
LIMITS_ENV = "KERNELRL_LIMITS"


def set_own_limits() -> None:
    """The limits the judge chose (`LIMITS_ENV`), set on this process before any program is given.

    Lowering a limit needs no privilege, so this works whatever the worker's uid; the judge reads
    the process limit back from /proc.
    """
    names = {"core": resource.RLIMIT_CORE, "nofile": resource.RLIMIT_NOFILE, "fsize": resource.RLIMIT_FSIZE,
             "as": resource.RLIMIT_AS, "nproc": resource.RLIMIT_NPROC}
    for item in filter(None, os.environ.get(LIMITS_ENV, "").split(",")):
        name, _, value = item.partition("=")
        which = names[name]
        hard = resource.getrlimit(which)[1]
        cap = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
        resource.setrlimit(which, (cap, cap))
