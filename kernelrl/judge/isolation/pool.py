"""Warm workers: interpreters started ahead of need, with torch already imported.

Starting a worker costs a second or more (a fresh interpreter importing torch); an evaluation
needs at least two. A `WorkerPool` keeps `size` workers started and waiting, and starts a new
one in the background each time one is taken, so an evaluation takes workers that are ready.
What a worker is started as (settings, device, folder, containment level) is its `Starter`'s.

A call that knows how many workers it will take says so (`claim`, updated with `expect` as it
learns more, each of its `take`s counted against it): while claims are open the pool keeps ready
only as many as they still expect (at most `size`), and tops up to `size` `_TOP_UP_AFTER_S` after
the last one closes, unless another claim opened or the pool closed by then. So no spare starts
during a batch: a start holds the device's lock shared (`starting`), and a spare nobody takes
would hold back the batch's own measurement; an evaluator closed after its batch starts no worker
only to kill it.

Guarantees:
- a worker handed out by `take` has never been given a program (it only said hello): no
  candidate ever gets a worker another program touched; workers are never returned to the pool,
  their owner closes them;
- every worker the pool holds is killed by `close` (also at interpreter exit), one still
  starting included: its starter sees the pool closed within `_POLL_S` and ends it, with
  everything it started (its cgroup, its process group), and lets go of `starting`;
- a worker that died while waiting is discarded, never handed out; when workers keep dying
  before they say hello, `take` raises the last one's death instead of starting more.

- `containment` is the level every worker it starts gets (`kernelrl.judge.isolation.containment`), decided
  once when the pool is made; `containment_notice` says, in one line, why it is less than full.

Does not limit how many workers run at once beyond `size` idle ones: owners bound their use.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kernelrl.judge.harness.channel import ChannelProtocolError, ChannelTimeout
from kernelrl.judge.harness.device import Device
from kernelrl.judge.isolation.containment import Probe, probe
from kernelrl.judge.isolation.sandbox import SandboxConfig, Worker, WorkerDied
from kernelrl.result import Containment

# A worker that has not said hello after this long is broken (torch import takes ~1-5 s).
_START_LIMIT_S = 120.0
# Workers that die before saying hello, in a row, that mean the interpreter cannot start one
# (kernelrl or torch not importable, a bad environment): the error is raised, not retried forever.
_START_FAILURES = 3
# How often a starter looks whether its pool was closed while a worker is starting.
_POLL_S = 0.25
# How long after its last claim closes the pool tops up: an evaluator closed after one batch
# (`evaluate`, a command's `eval`) is closed by then, and a next batch sooner starts its own.
_TOP_UP_AFTER_S = 1.0


@dataclass(eq=False)
class Claim:
    """Workers one call (a group of a batch) still expects to take (`WorkerPool.claim`)."""

    remaining: int


class Starter:
    """What a pool's workers are started as: their settings, device and folder, and the containment
    level they get, decided once (`probe`); counts the workers it started."""

    def __init__(self, *, config: SandboxConfig, device: Device, device_index: int | None, root: Path | None) -> None:
        self.config = config
        self.device = device
        self.device_index = device_index
        self.root = root
        self.probe: Probe = probe(config.containment, config.uids, device)
        self.started = 0  # workers started over the pool's life (for reports and tests)

    def start(self) -> Worker:
        self.started += 1
        return Worker(config=self.config, device=self.device, device_index=self.device_index, root=self.root)


class WorkerPool:
    """Ready workers, started by its `Starter` ahead of the claims of its callers (see the module
    docstring)."""

    def __init__(self, *, config: SandboxConfig, device: Device, device_index: int | None = None, size: int = 2,
                 root: Path | None = None,
                 starting: Callable[[], contextlib.AbstractContextManager[None]] | None = None) -> None:
        if size < 0:
            raise ValueError("pool size must be >= 0")
        self.size = size
        self._starter = Starter(config=config, device=device, device_index=device_index, root=root)
        # Held while a worker starts in the background (an interpreter importing torch uses the
        # cores): the evaluator passes its lane's shared hold, so no start overlaps a measurement.
        self._starting = starting or contextlib.nullcontext
        self._idle: deque[Worker] = deque()  # said hello, waiting for a program
        self._booting: list[Worker] = []  # started, not ready yet
        self._ready = threading.Condition()  # guards the lists below; notified when a worker is ready
        self._closed = False
        self._claims: list[Claim] = []  # open calls (`claim`)
        self.handed_out = 0
        threading.Thread(target=self._fill, name="kernelrl-pool-fill", daemon=True).start()
        atexit.register(self.close)

    @property
    def started(self) -> int:
        """Workers started over the pool's life (for reports and tests)."""
        return self._starter.started

    @property
    def containment(self) -> Containment:
        """The containment of every worker this pool hands out (a server refuses less than FULL)."""
        return self._starter.probe.level

    def containment_notice(self) -> str | None:
        """One line saying the workers are less than fully contained, and why; None when they are full."""
        found = self._starter.probe
        if found.level is Containment.FULL:
            return None
        return f"kernelrl: workers are not fully contained (containment: {found.level.value}): {found.reason}"

    def warn_if_uncontained(self) -> None:
        """Print `containment_notice` to stderr, where there is one."""
        notice = self.containment_notice()
        if notice:
            print(notice, file=sys.stderr, flush=True)

    def _target(self) -> int:
        """How many workers should be ready or starting now (called holding `_ready`)."""
        if not self._claims:
            return self.size
        return min(self.size, sum(c.remaining for c in self._claims))

    @contextlib.contextmanager
    def claim(self, n: int) -> Iterator[Claim]:
        """A call that will take about `n` workers (see the module docstring); calls may overlap."""
        c = Claim(remaining=max(0, n))
        with self._ready:
            self._claims.append(c)
        self._refill()
        try:
            yield c
        finally:
            with self._ready:
                self._claims.remove(c)
                last = not self._claims
            self._refill(after=_TOP_UP_AFTER_S if last else 0.0)

    def expect(self, claim: Claim, n: int) -> None:
        """The call now expects to take `n` more workers (it learned some will not be needed)."""
        with self._ready:
            claim.remaining = max(0, n)
        self._refill()

    def _refill(self, *, after: float = 0.0) -> None:
        def fill() -> None:
            if after > 0:
                time.sleep(after)
            self._fill()

        threading.Thread(target=fill, name="kernelrl-pool-fill", daemon=True).start()

    def _fill(self) -> None:
        with self._ready:
            if self._closed or len(self._idle) + len(self._booting) >= self._target():
                return  # nothing to start: no hold taken
        with self._starting():
            started = []
            with self._ready:
                while not self._closed and len(self._idle) + len(self._booting) < self._target():
                    try:
                        w = self._starter.start()
                    except (OSError, RuntimeError):
                        break  # no process now (the judge exiting, no descriptors left): `take` starts one or says why
                    self._booting.append(w)
                    started.append(w)
            for w in started:
                ok = self._await_hello(w)
                with self._ready:
                    self._booting.remove(w)
                    if ok and not self._closed:
                        self._idle.append(w)
                        self._ready.notify()
                        continue
                    self._ready.notify()
                w.kill()  # now: `close` would first wait up to 2 s for a worker still starting to read its exit
                w.close()

    def _await_hello(self, w: Worker) -> bool:
        """Whether `w` said hello within the start limit; False as soon as the pool is closed, so
        a closed pool's starter holds `starting` (the device's lock) no longer than `_POLL_S`."""
        limit = time.monotonic() + _START_LIMIT_S
        while not self._closed:
            left = limit - time.monotonic()
            if left <= 0:
                return False
            if w.channel.pending(min(_POLL_S, left)):
                try:
                    w.wait_ready(deadline=limit)
                except (WorkerDied, ChannelProtocolError, ChannelTimeout):
                    return False
                return True
        return False

    def take(self, role: str, *, deadline: float | None = None, claim: Claim | None = None) -> Worker:
        """A ready worker that no program has touched (started now if none is waiting), counted
        against `claim` when the call made one.

        Raises WorkerDied, with the last one's log, when workers keep dying before they say hello.
        """
        failures = 0
        while True:
            worker = None
            with self._ready:
                while not self._closed and not self._idle and self._booting:
                    # one is importing torch already: wait for it rather than start another
                    self._ready.wait(timeout=1.0)
                if self._closed:
                    raise RuntimeError("worker pool is closed")
                if self._idle:
                    worker = self._idle.popleft()
                if claim is not None:
                    claim.remaining = max(0, claim.remaining - 1)
            if worker is None:
                worker = self._starter.start()
            limit = time.monotonic() + _START_LIMIT_S
            try:
                worker.wait_ready(deadline=min(deadline, limit) if deadline is not None else limit)
            except (WorkerDied, ChannelProtocolError):
                worker.close()
                failures += 1
                if failures >= _START_FAILURES:
                    raise
                continue
            except ChannelTimeout:
                worker.close()
                raise
            finally:
                # Refill in the background (as far as `_target` says): the next take should not wait for an import.
                self._refill()
            worker.role = role
            self.handed_out += 1
            return worker

    def close(self) -> None:
        with self._ready:
            self._closed = True
            idle, self._idle = list(self._idle), deque()
            self._ready.notify_all()
        for w in idle:
            w.kill()
            w.close()
