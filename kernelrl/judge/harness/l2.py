"""The GPU's persisting-L2 carveout, emptied before every sample: a program's inputs kept in L2 as
"persisting" lines do not survive the eviction that starts each sample.

Since Ampere a program can set aside part of L2 for persisting accesses
(`cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, n)`, then an access policy window on a
stream, a graph node or a kernel launch). Lines marked persisting stay in that carveout while
normal lines are evicted, so the worker's eviction (a write over a buffer larger than L2) would
leave the program's inputs resident when its timed call starts: a published exploit measured
3,530 GB/s against an honest 714 GB/s that way.

Guarantees: on a GPU, before the eviction of every sample (outside the timed region, every member
alike), the worker empties the carveout on each GPU it sees: the limit set to 0 bytes and every
persisting line made normal (`cudaCtxResetPersistingL2Cache`), so the eviction that follows
writes them out. The CUDA runtime's functions are found when the worker starts on the device
(the runtime torch loaded, from the process's own mappings), before any program runs. A GPU
without the carveout (before Ampere) answers with an error, which is counted
(`PersistingL2.errors`) and changes nothing.

Does not: stop a program from setting the carveout again inside its timed call (it pays for that
there, and its inputs were evicted before the call began), or act on a CPU.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

# `cudaLimitPersistingL2CacheSize` in the CUDA runtime's `cudaLimit` enum.
PERSISTING_L2_LIMIT = 0x06


def runtime_path(maps: str | None = None) -> str | None:
    """The CUDA runtime library this process has loaded (torch's), from /proc/self/maps; None if none."""
    if maps is None:
        try:
            with open("/proc/self/maps") as f:
                maps = f.read()
        except OSError:
            return None
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if "/libcudart.so" in path:
            return path
    return None


class PersistingL2:
    """Empties the persisting-L2 carveout of every GPU the worker sees (`reset`)."""

    def __init__(self, *, set_limit: Callable[[int, int], int], reset_lines: Callable[[], int], devices: int,
                 exchange_device: Callable[[int], int] | None) -> None:
        self._set_limit = set_limit
        self._reset_lines = reset_lines
        self._devices = devices
        self._exchange = exchange_device
        self.errors = 0  # calls the runtime refused (a GPU without the carveout)

    @classmethod
    def bind(cls, *, devices: int, exchange_device: Callable[[int], int] | None) -> PersistingL2 | None:
        """The runtime's functions, bound now; None where no CUDA runtime is loaded."""
        path = runtime_path()
        if path is None:
            return None
        try:
            lib: Any = ctypes.CDLL(path)
            set_limit, reset_lines = lib.cudaDeviceSetLimit, lib.cudaCtxResetPersistingL2Cache
        except (OSError, AttributeError):
            return None
        set_limit.argtypes, set_limit.restype = [ctypes.c_int, ctypes.c_size_t], ctypes.c_int
        reset_lines.argtypes, reset_lines.restype = [], ctypes.c_int
        return cls(set_limit=set_limit, reset_lines=reset_lines, devices=devices, exchange_device=exchange_device)

    def reset(self) -> None:
        """No carveout and no persisting line on any GPU the worker sees; the current GPU kept."""
        if self._devices <= 1 or self._exchange is None:
            self._reset_current()
            return
        for index in range(self._devices):
            previous = self._exchange(index)
            self._reset_current()
            self._exchange(previous)

    def _reset_current(self) -> None:
        # The limit first: with no carveout left, no line can be made persisting again before
        # the lines already persisting are made normal (and then evicted).
        self.errors += self._set_limit(PERSISTING_L2_LIMIT, 0) != 0
        self.errors += self._reset_lines() != 0
