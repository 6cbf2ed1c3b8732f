"""Device memory: what a worker reads of it, what it gives back, and whose an out-of-memory error is.

A GPU is shared: the task's kept reference workers hold their inputs there, and other groups'
correctness runs come and go. A candidate that runs out of device memory because others held it
did nothing wrong; one that ran out with the device to itself did.

Guarantees:
- a worker on a device gives its cached blocks back after making a task's inputs, after each
  correctness run and after an out-of-memory error (`release`), so what it holds between commands
  is what it still uses;
- a correctness run reports the most device memory the program had allocated during it
  (`EvalResult.peak_device_bytes`);
- an out-of-memory error is the judge's (`Blame.JUDGE`: a `judge_error`, not paid, judged again)
  only when it happened twice in a row and, the second time, the memory other processes held left
  the program less than `PROMISED_SHARE` of the device; without device facts (a CPU, where a
  program can raise the error itself) it is always the program's.

Does not reserve memory ahead of a run (groups are admitted by host memory,
`kernelrl.judge.timing.inputs.memory_need`), and reads only torch's allocator as the program's own: memory a
program allocated past it (a raw cudaMalloc) counts as another process's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

__all__ = ["PROMISED_SHARE", "Blame", "DeviceMemory", "blame", "peak", "read", "release", "reset_peak"]

# The share of a device's memory a candidate may count on: half, so that a task's kept reference
# workers and a second group's run fit beside it.
PROMISED_SHARE = 0.5


@dataclass(frozen=True, kw_only=True)
class DeviceMemory:
    """A device's memory as one worker saw it (bytes)."""

    free_bytes: int
    total_bytes: int
    own_bytes: int  # what this worker's allocator held

    @property
    def others_bytes(self) -> int:
        return max(0, self.total_bytes - self.free_bytes - self.own_bytes)


class Blame(enum.StrEnum):
    CANDIDATE = "candidate"
    JUDGE = "judge"


def blame(memory: DeviceMemory | None, *, share: float = PROMISED_SHARE) -> Blame:
    """Whose a repeated out-of-memory error is (see the module's guarantees)."""
    if memory is None or memory.total_bytes <= 0:
        return Blame.CANDIDATE
    left = memory.total_bytes - memory.others_bytes
    return Blame.JUDGE if left < share * memory.total_bytes else Blame.CANDIDATE


# Bound when a worker imports this module, before any program code runs.
_on_cuda = torch.cuda.is_available


def read(device: str) -> DeviceMemory | None:
    """This worker's view of its device's memory; None on a CPU."""
    if device != "cuda" or not _on_cuda():
        return None
    free, total = torch.cuda.mem_get_info()
    return DeviceMemory(free_bytes=int(free), total_bytes=int(total), own_bytes=int(torch.cuda.memory_reserved()))


def release(device: str) -> None:
    """Give the allocator's cached blocks back to the device."""
    if device == "cuda" and _on_cuda():
        torch.cuda.empty_cache()


def reset_peak(device: str) -> None:
    if device == "cuda" and _on_cuda():
        torch.cuda.reset_peak_memory_stats()


def peak(device: str) -> int:
    """The most memory allocated since `reset_peak` (bytes); 0 on a CPU."""
    return int(torch.cuda.max_memory_allocated()) if device == "cuda" and _on_cuda() else 0
