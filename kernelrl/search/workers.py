"""The search's threads: every blocking call (a model call, a batch of evaluations, a baseline, a
task's profile) runs on its own thread, and its outcome comes back on one event queue.

Guarantees: a call runs while it holds a slot of its kind (`model_concurrency` model calls at
once; one batch or injected baseline measurement at a time, or `BATCHES_AT_ONCE` batches of a
streaming judge; two profiles); its outcome, or the
exception it raised, is put on the queue bound to the handler the caller named for it (typed: the
handler takes what the call returns, or an exception), and only the thread that reads the queue
(the loop's) runs that handler. The threads are daemons: a second Ctrl-C may
leave while a call is still under way.

Does not time out, retry or cancel a call.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from functools import partial
from typing import TypeVar

_T = TypeVar("_T")

# Batches of a streaming judge under way at once: its places, not this, bound the work (each
# batch holds one task's candidates at most once, so more than a few at once only wait).
BATCHES_AT_ONCE = 4

# A call's outcome bound to its handler: the loop's thread runs it.
Event = Callable[[], None]


class Workers:
    def __init__(self, model_concurrency: int) -> None:
        self.events: queue.Queue[Event] = queue.Queue()
        self.model_slots = threading.Semaphore(model_concurrency)
        self.eval_slots = threading.Semaphore(1)  # batches and injected baseline measurements, one at a time
        # batches of a judge that shares its places among them (`kernelrl.search.judging`): a few at once
        self.batch_slots = threading.Semaphore(BATCHES_AT_ONCE)
        self.profile_slots = threading.Semaphore(2)

    def spawn(self, name: str, slots: threading.Semaphore, fn: Callable[[], _T],
              on_done: Callable[[_T | BaseException], None]) -> None:
        """Run `fn` on a thread (named `name`) under `slots`; `on_done` gets its outcome, or the
        exception it raised, on the loop's thread."""
        def body() -> None:
            out: _T | BaseException
            with slots:
                try:
                    out = fn()
                except BaseException as e:  # noqa: BLE001 - reported to the loop, which decides
                    out = e
            self.events.put(partial(on_done, out))

        # Daemon threads: a second Ctrl-C may leave while a call is still under way.
        threading.Thread(target=body, name=f"kernelrl-{name}", daemon=True).start()

    def post(self, handler: Event) -> None:
        """An event from a call still under way (a batch's result that is final)."""
        self.events.put(handler)

    def next(self, timeout: float) -> Event | None:
        """The next event, or None when none came within `timeout` seconds."""
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None
