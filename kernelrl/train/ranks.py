"""The processes of one training run, and the few things they must agree on.

Under `accelerate launch` every process (rank) runs the prompt stream, the reward function and
the callbacks. Whatever decides what is trained on is decided once and shared:

- the prompts (and so the tasks and the curriculum's draws): the main process builds each row
  and broadcasts it (`kernelrl.train.stream`);
- the rewards' clip windows, GRPO-RoC's choices and the curriculum's observations: every rank
  gathers every rank's raw rewards and applies them in one order, the global batch's
  (`kernelrl.train.reward_fn`), so all ranks hold the same state;
- the sampling work of rejection-sampling rounds: split by rank, without duplicates
  (`kernelrl.train.rft`).

`Ranks` is what those modules take: `index`, `count`, `broadcast` (the main process's object on
every rank), `gather` (every rank's list, concatenated in rank order, on every rank) and
`barrier`. `current_ranks()` is `AccelerateRanks` (accelerate's `PartialState` and
torch.distributed's object collectives: gloo on CPUs, NCCL on GPUs) when the process is one of
several, else `SingleProcess`, where every operation is trivial.

Guarantees: `gather` keeps rank order, which is TRL's order of the global generation batch
(each rank holds a contiguous slice of it). Every collective must be called by every rank in
the same order; the callers above call them at points every rank reaches (one row, one reward
call, one round).

Does not start processes (accelerate does) and does not move tensors.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Ranks(Protocol):
    @property
    def index(self) -> int: ...

    @property
    def count(self) -> int: ...

    @property
    def is_main(self) -> bool: ...

    def broadcast(self, obj: T) -> T:
        """The main process's `obj` on every rank (what the others pass is ignored: None)."""
        ...

    def gather(self, items: Sequence[T]) -> list[T]: ...

    def barrier(self) -> None: ...


@dataclass(frozen=True)
class SingleProcess:
    """One process: it decides alone."""

    index: int = 0
    count: int = 1

    @property
    def is_main(self) -> bool:
        return True

    def broadcast(self, obj: T) -> T:
        return obj

    def gather(self, items: Sequence[T]) -> list[T]:
        return list(items)

    def barrier(self) -> None:
        pass


class AccelerateRanks:
    """The processes `accelerate launch` (or torchrun) started, through accelerate's shared state.

    `cpu`: the processes meet over gloo on the CPU (accelerate makes a CPU run distributed only
    when told so); the Trainer later rebuilds the same state from its own arguments."""

    def __init__(self, *, cpu: bool = False) -> None:
        from accelerate import PartialState

        self._state = PartialState(cpu=cpu)

    @property
    def index(self) -> int:
        return int(self._state.process_index)

    @property
    def count(self) -> int:
        return int(self._state.num_processes)

    @property
    def local_index(self) -> int:
        return int(self._state.local_process_index)

    @property
    def is_main(self) -> bool:
        return bool(self._state.is_main_process)

    def broadcast(self, obj: T) -> T:
        from accelerate.utils import broadcast_object_list

        box: list[Any] = [obj if self.is_main else None]
        broadcast_object_list(box, from_process=0)
        return box[0]  # type: ignore[no-any-return]

    def gather(self, items: Sequence[T]) -> list[T]:
        from accelerate.utils import gather_object

        return list(gather_object(list(items)))

    def barrier(self) -> None:
        self._state.wait_for_everyone()


def launched_processes() -> int:
    """How many processes the launcher started (1 without a launcher)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def current_ranks(*, cpu: bool | None = None) -> Ranks:
    """The run's processes. `cpu` None: on the CPU when accelerate was told so or there is no CUDA."""
    if launched_processes() <= 1:
        return SingleProcess()
    if cpu is None:
        import torch

        cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true") or not torch.cuda.is_available()
    return AccelerateRanks(cpu=cpu)


def local_device_index(ranks: Ranks) -> int:
    """This process's GPU on its machine (accelerate's local rank; 0 for one process)."""
    return int(getattr(ranks, "local_index", 0))
