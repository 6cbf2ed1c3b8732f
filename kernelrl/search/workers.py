"""The search's threads: every blocking call (a model call, a batch of evaluations, a baseline, a
task's profile) runs on its own thread, and its outcome comes back on one event queue.

Guarantees: a call runs while it holds a slot of its kind (`model_concurrency` model calls at
once; one batch or injected baseline measurement at a time; two profiles); its outcome, or the
exception it raised, is put on the queue as one `(kind, payload, outcome)` event, and only the
thread that reads the queue (the loop's) acts on it. The threads are daemons: a second Ctrl-C may
leave while a call is still under way.

Does not time out, retry or cancel a call.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

# (kind, payload, outcome: a value or the exception raised); the kind says what the other two are
Event = tuple[str, object, object]


class Workers:
    def __init__(self, model_concurrency: int) -> None:
        self.events: queue.Queue[Event] = queue.Queue()
        self.model_slots = threading.Semaphore(model_concurrency)
        self.eval_slots = threading.Semaphore(1)  # batches and injected baseline measurements, one at a time
        self.profile_slots = threading.Semaphore(2)

    def spawn(self, kind: str, slots: threading.Semaphore, fn: Callable[[], object], payload: object) -> None:
        """Run `fn` on a thread under `slots`; its outcome comes back as `(kind, payload, outcome)`."""
        def body() -> None:
            with slots:
                try:
                    out: object = fn()
                except BaseException as e:  # noqa: BLE001 - reported to the loop, which decides
                    out = e
            self.events.put((kind, payload, out))

        # Daemon threads: a second Ctrl-C may leave while a call is still under way.
        threading.Thread(target=body, name=f"kernelrl-{kind}", daemon=True).start()

    def put(self, kind: str, payload: object, out: object) -> None:
        """An event from a call still under way (a batch's result that is final)."""
        self.events.put((kind, payload, out))

    def next(self, timeout: float) -> Event | None:
        """The next event, or None when none came within `timeout` seconds."""
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None
