"""A worker's commands and answers as the judge exchanges them (`Exchanges`, one per `sandbox.Worker`):
each command sent over its channel and its answer received, typed (`Answer`).

Guarantees:
- the arena is sealed before the first command, at the size set for it (`size_arena`: the task's
  largest message), or the channel's default where none was set;
- from the timing pool on (`Kind.POOL`), the worker's strays are ended before each command is
  sent and again as soon as its answer arrives (or fails to); the exchange's own duration
  (`last_exchange_ns`, the judge's clock) leaves that census out;
- an answer is the kind its command allows, or an error; anything else is a
  `ChannelProtocolError`; a worker that stops accepting commands or exits without answering is
  the worker's death (`WorkerDied`, made by its handle);
- an error's message and traceback pass through `kernelrl.judge.isolation.redact` before anything
  else reads them;
- each timed call's commitments to its outputs (`Called.commits`) are kept, and every output handed
  over for a spot check is checked against its call's (`uncommitted`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernelrl.judge.harness.channel import (
    DEFAULT_ARENA_BYTES,
    Arena,
    Channel,
    ChannelClosed,
    ChannelProtocolError,
    commitment,
)
from kernelrl.judge.harness.protocol import ANSWERS, Error, Header, Kind, Output, decode, encode
from kernelrl.judge.isolation.redact import redact


@dataclass(frozen=True)
class Answer:
    """A worker's typed answer to one command (`kernelrl.judge.harness.protocol`)."""

    kind: Kind
    header: Any
    payload: Any = None

    @property
    def failed(self) -> bool:
        return self.kind is Kind.ERROR


class Exchanges:
    """One worker's exchanges over `channel` and `arena`: `end_strays` ends its stray processes, and
    `died(what)` is the exception its death raises. Notes whether its timing began, the last
    exchange's duration, each timed call's commitments, and the spot-checked outputs (`outputs`) that
    are not what their call committed to (`uncommitted`)."""

    def __init__(self, channel: Channel, arena: Arena, *, end_strays: Callable[[], int],
                 died: Callable[[str], Exception]) -> None:
        self.channel = channel
        self.arena = arena
        self._end_strays = end_strays
        self._died = died
        self.arena_need: int | None = None
        self.timing = False
        self.last_exchange_ns = 0
        self.commits: list[int] = []
        self.outputs = 0
        self.uncommitted = 0

    def size_arena(self, need: int) -> None:
        """The arena's size for good, set before the first command."""
        if self.arena.sealed:
            raise RuntimeError("the worker's arena is already sized")
        self.arena_need = need

    def exchange(self, kind: Kind, header: Header | None, payload: Any, deadline: float | None) -> Answer:
        """Send one command and receive its answer (see the module docstring)."""
        if not self.arena.sealed:
            self.arena.seal(self.arena_need or DEFAULT_ARENA_BYTES)
        self.timing = self.timing or kind is Kind.POOL
        if self.timing:
            self._end_strays()
        t0 = time.perf_counter_ns()  # the exchange alone: the stray census is the judge's work, and noisy
        try:
            self.channel.send(kind.value, encode(kind, header), payload)
        except (BrokenPipeError, OSError) as e:
            raise self._died(f"worker stopped accepting commands ({e})") from e
        try:
            answer = self.receive(deadline)
            self.last_exchange_ns = time.perf_counter_ns() - t0
        finally:
            if self.timing:
                self._end_strays()
        if answer.kind is not ANSWERS.get(kind) and answer.kind is not Kind.ERROR:
            raise ChannelProtocolError(f"{kind.value} answered with {answer.kind.value}")
        self._note(answer, header)
        return answer

    def receive(self, deadline: float | None) -> Answer:
        """The worker's next message, typed; its death where it exited without answering."""
        try:
            msg = self.channel.recv(deadline)
        except ChannelClosed as e:
            raise self._died("worker exited without answering") from e
        kind, header = decode(msg.kind, msg.header)
        if isinstance(header, Error):  # shown in a verdict: nothing of the judge's machine in it
            header = dataclasses.replace(header, message=redact(header.message), traceback=redact(header.traceback))
        return Answer(kind=kind, header=header, payload=msg.payload)

    def _note(self, answer: Answer, header: Header | None) -> None:
        if answer.kind is Kind.CALLED:
            self.commits = list(answer.header.commits)
        elif answer.kind is Kind.OUTPUT_DATA and isinstance(header, Output):
            committed = self.commits[header.call] if 0 <= header.call < len(self.commits) else None
            payload = answer.payload if isinstance(answer.payload, dict) else {}
            self.outputs += 1
            self.uncommitted += committed is None or commitment(payload.get("output")) != committed
