"""The worker's device as the harness uses it (`Bench`): started once per program with the judge's
thread count and precision, synchronised device-wide around every timed call, its cache evicted
before every sample.

Guarantees: the synchronisation calls (`torch._C._cuda_synchronize`, the device exchange) and the
tensor op that evicts the cache are bound when this module is imported, which the worker does
before any program code runs (`kernelrl.judge.harness.worker`): a program that rebinds
`torch.cuda.synchronize`, the C function behind it or `Tensor.add_` changes nothing here. A
synchronisation is device-wide on every GPU the worker sees, whichever device the program left
current, and puts that device back. Imports nothing of kernelrl outside the worker side.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from kernelrl.judge.harness.l2 import PersistingL2
from kernelrl.judge.harness.precision import set_precision

# What evicts the cache before a sample, bound now: a program that replaces torch's ops (to slow
# whatever else runs in its process) cannot change the harness's own work.
_add_ = torch.Tensor.add_
# The C functions behind torch.cuda.synchronize, bound now: torch.cuda.synchronize looks
# `torch._C._cuda_synchronize` up at each call, so a program could otherwise make it a no-op.
_cuda_synchronize: Any = getattr(torch._C, "_cuda_synchronize", None)  # None in a CPU build of torch
_cuda_exchange_device: Any = getattr(torch._C, "_cuda_exchangeDevice", None)


def sync_every_gpu(devices: int) -> None:
    """cudaDeviceSynchronize on each GPU this process sees: every stream of each.

    A program may have left another device current (work queued on it would escape a
    synchronisation of the current device only); the current device is put back after.
    """
    if devices <= 1 or _cuda_exchange_device is None:
        _cuda_synchronize()
        return
    for index in range(devices):
        previous = _cuda_exchange_device(index)
        _cuda_synchronize()
        _cuda_exchange_device(previous)


def call_floor_ns(sync: Callable[[], None], clock: Callable[[], int], *, n: int = 201) -> float:
    """This worker's timing bracket around nothing (sync, clock, sync, clock): its median, in ns.

    Here, not in `kernelrl.judge.timing.timer`: a worker imports no more than it runs (the timer's
    imports, the static checker's rules among them, cost every worker's start ~0.1 s).
    """
    times = []
    for _ in range(n):
        sync()
        t0 = clock()
        sync()
        times.append(clock() - t0)
    return float(statistics.median(times))


class Bench:
    """The worker's device: which one, how many GPUs it sees, the persisting-L2 carveout it empties
    and the buffer it writes to evict the cache."""

    def __init__(self) -> None:
        self.device = "cpu"
        self.cuda_devices = 0  # GPUs this worker sees (cuda only)
        self.l2: PersistingL2 | None = None  # on a GPU: the persisting-L2 carveout, emptied before each sample
        self.evict_buf: torch.Tensor | None = None

    def start(self, device: str, threads: int, evict_bytes: int, allow_tf32: bool) -> None:
        self.device = device
        torch.set_num_threads(int(threads))
        set_precision(bool(allow_tf32))
        if device == "cuda":
            torch.cuda.init()  # type: ignore[no-untyped-call]
            self.cuda_devices = torch.cuda.device_count()
            self.l2 = PersistingL2.bind(devices=self.cuda_devices, exchange_device=_cuda_exchange_device)
        if evict_bytes:
            self.evict_buf = torch.zeros(evict_bytes // 4, dtype=torch.float32, device=device)
            self.evict_buf.add_(1.0)  # starts the OpenMP pool now: threads seen in timed calls are the program's

    def sync(self) -> None:
        if self.device == "cuda":
            sync_every_gpu(self.cuda_devices)

    def evict(self) -> None:
        if self.l2 is not None:  # before the write: lines made normal are evicted by it
            self.l2.reset()
        if self.evict_buf is not None:
            _add_(self.evict_buf, 1.0)
        self.sync()
