"""What a worker sets on itself, from the environment the judge gave it: transparent huge pages
off and its limits at start-up, before it says hello; the allocator's pinned settings when its
timing begins (`allocator_pin`).

Guarantees: `set_own_limits` only lowers limits (no privilege needed, whatever the worker's uid),
and the judge reads the process limit back from /proc rather than taking the worker's word.
Does not choose any value: the judge does (`kernelrl.judge.isolation.sandbox`). Imports nothing of torch or
of the judge, so a worker reads it before importing torch.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable

# The allocator's settings while a worker is timed: every allocation from the heap, never from
# mmap, and freed memory stays there. A tensor of 32 MiB or more (glibc's largest mmap threshold)
# was otherwise mapped afresh, and its pages faulted in and zeroed, on every call in one process,
# but carved from free heap in another, depending on each process's history; identical code
# measured up to 1.7x apart between two processes (benchmarks/README.md, timing noise). A fixed
# threshold also turns off the adaptive one that made large-tensor timings swing up to 3x.
#
# Only from the timing pool on (`allocator_pin`, called by the worker when it is given its pool):
# a heap that keeps what it freed also keeps the holes of every earlier allocation pattern. Pinned
# from its start, a reference worker making five input sets of 256 MiB tensors peaked at 6.7 sets
# (3.8 pinned from its timing pool on), a candidate's checks at 1755 MiB (1499)
# (benchmarks/README.md, memory of one evaluation). Every timed worker switches at the same point
# of its exchange, so no member's timing starts from a luckier heap than another's.
#
# Carved from the heap, a tensor lands wherever the process's history left free space, so the
# distance between a call's input and its output, modulo 4 KiB, differed from process to process;
# an output starting 64-256 bytes past its input (modulo 4 KiB) made loads wait on unrelated
# stores (4K aliasing): GELU on 4 MiB ran 10 % slower at 64 bytes than at 0, in one process
# (benchmarks/README.md, timing noise). Torch's THP allocation setting starts every tensor of
# 2 MiB or more on a page boundary, so every such input and output pair is 0 apart modulo 4 KiB in
# every process; the worker turns transparent huge pages off for itself (`NO_HUGE_PAGES_ENV`), so
# whether a tensor happens to span an aligned 2 MiB extent cannot make it faster either.
PIN_ALLOCATOR_ENV = "KERNELRL_PIN_ALLOCATOR"  # "1": pin the allocator when timing begins
PINNED_ALLOCATOR_ENV = {PIN_ALLOCATOR_ENV: "1", "THP_MEM_ALLOC_ENABLE": "1"}
# glibc's mallopt parameters (malloc.h) and their pinned values
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -2, -3, -4
PINNED_MALLOPT = ((_M_MMAP_MAX, 0), (_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 1 << 30), (_M_TOP_PAD, 64 << 20))
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


def allocator_pin() -> Callable[[], bool] | None:
    """Where the judge asked for it (`PIN_ALLOCATOR_ENV`), a function that pins this process's
    allocator (`PINNED_MALLOPT`) and says whether glibc took every setting; None where it did not
    ask, or where there is no glibc `mallopt`. Resolved when called, at the worker's start: a
    program's code, which runs later, cannot swap the function the worker keeps."""
    if os.environ.get(PIN_ALLOCATOR_ENV) != "1":
        return None
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int

    def pin() -> bool:
        return all(mallopt(param, value) == 1 for param, value in PINNED_MALLOPT)

    return pin
