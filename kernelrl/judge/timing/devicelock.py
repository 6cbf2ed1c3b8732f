"""Device locks: one per device, so measurements never compete for what they measure.

A device lock is a lock file in the evaluator's cache folder, named after the device: `cpu` (the
whole machine: one lock), `cuda-0`, `cuda-1`, ... (one per GPU). Timing holds its device's lock
exclusively; work that would disturb a measurement on that device holds it shared (on a CPU:
builds and correctness runs, which use the same cores; on a GPU: a candidate's construction and
correctness runs, which use the same GPU — builds run on the CPU and overlap GPU timing freely).

Guarantees: the locks are `flock` locks on a file per device, so they hold across threads (each
acquisition opens its own file description) and across processes sharing the cache folder; a
process that dies releases its locks. Eight GPUs are eight locks: eight measurements at once.
Within a process a waiting measurement goes first: once `timing` is asked for, no new `work` of
this process starts until the measurement is over, so the work already under way drains and the
measurement cannot be starved by work that keeps arriving (`flock` itself prefers no one).

A GPU's lock is named after the device the judge's process sees as that index: its entry in
`CUDA_VISIBLE_DEVICES` (an index or a UUID, MIG included) when that is set, so lanes that each see
a different GPU as their device 0 (Ray's actors, a scheduler's subsets) hold different locks, and
two that see one GPU hold the same. `build()` is what a candidate's build and import hold: on a
CPU the shared lock (they use the cores being measured); on a GPU nothing, so builds (nvcc, 52 s
cold on an H100) overlap another group's measurement. `device_work()` is what its construction
(parameters moved to the GPU), the reference's parameters copied in and its correctness runs
hold: so work a program puts on the GPU while it is made lands in no other group's samples and
in no idle probe after them (`kernelrl.judge.timing.idle`, which would count it against the member timed).

Does not stop programs outside kernelrl from using the device, nor a program's module-level code
(run at import, with its build, outside the lock on a GPU) or work it leaves running past its
construction from reaching the GPU while another group is measured: a group's members are
interleaved, so such drift lands on all of them alike in the times, and the idle probe after a
sample counts it against whichever member was timed then (at most a work's length of samples).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from kernelrl.judge.harness.device import Device


def lock_name(device: Device, device_index: int | None = None, visible: str | None = None) -> str:
    """`cpu`, or `cuda-X` where X is the GPU the judge sees as `device_index` (default 0): its entry in
    `visible` (default: this process's CUDA_VISIBLE_DEVICES) when there is one, else the index."""
    if device == Device.CPU:
        return "cpu"
    index = device_index if device_index is not None else 0
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    physical = entries[index] if index < len(entries) else str(index)
    return "cuda-" + re.sub(r"[^A-Za-z0-9._-]", "_", physical)


class DeviceLock:
    """See the module docstring. Thread-safe; one per evaluator and device."""

    def __init__(self, cache_dir: Path, device: Device, device_index: int | None = None) -> None:
        self.name = lock_name(device, device_index)
        self.device = device
        self.path = Path(cache_dir) / "locks" / f"{self.name}.lock"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.waited_s = 0.0  # time spent waiting for this lock (recorded with results)
        self._gate = threading.Condition()
        self._measuring = 0  # measurements of this process waiting for the lock or holding it

    @contextlib.contextmanager
    def _hold(self, mode: int) -> Iterator[None]:
        t0 = time.monotonic()
        with open(self.path, "a") as f:
            fcntl.flock(f, mode)
            self.waited_s += time.monotonic() - t0
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        """Exclusive: nothing else uses the device while this is held."""
        with self._gate:
            self._measuring += 1
        try:
            with self._hold(fcntl.LOCK_EX):
                yield
        finally:
            with self._gate:
                self._measuring -= 1
                self._gate.notify_all()

    @contextlib.contextmanager
    def _work(self) -> Iterator[None]:
        t0 = time.monotonic()
        with self._gate:
            while self._measuring:
                self._gate.wait()
        self.waited_s += time.monotonic() - t0
        with self._hold(fcntl.LOCK_SH):
            yield

    def build(self) -> contextlib.AbstractContextManager[None]:
        """Around a candidate's build and import: shared on a CPU (the cores), nothing on a GPU."""
        return self.work(uses_device=False)

    def device_work(self) -> contextlib.AbstractContextManager[None]:
        """Around a candidate's construction and correctness runs, inside `build()`: the shared lock on a GPU; nothing
        more on a CPU (`build()` holds it already; taking it again could wait behind a measurement
        that waits for the first)."""
        return contextlib.nullcontext() if self.device == Device.CPU else self._work()

    def work(self, *, uses_device: bool) -> contextlib.AbstractContextManager[None]:
        """Shared, for work that must not overlap a measurement on this device.

        On a CPU every piece of work uses the device (the cores); on a GPU only work that runs
        on the GPU does.
        """
        if self.device == Device.CPU or uses_device:
            return self._work()
        return contextlib.nullcontext()
