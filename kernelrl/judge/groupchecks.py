"""A group's checks: the builds and correctness runs of every trial reading did not refuse, a few at a
time batch-wide (`check_trials`), each in a fresh pool worker whose arena is sized to its task's
largest message (`task_arena`).

Guarantees: which trial gets the pool's oldest worker, and starts first, is chance (the group's
secret generator); on a CPU a whole trial holds the device's lock shared, on a GPU only its
correctness runs do, so no check runs during a measurement on a CPU and builds overlap
measurements on a GPU; a trial's clock starts once the lock lets its work in; the judge's own
trouble with one trial ends that trial with a `judge_error`, never the batch.

Does not decide what a trial's facts mean: `kernelrl.judge.trial` runs it, `kernelrl.checks.dynamic`
reads it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from kernelrl.judge.context import JudgeContext
from kernelrl.judge.grouprecord import waited
from kernelrl.judge.harness.channel import arena_need, payload_bytes
from kernelrl.judge.reference import InputSet, ReferenceSession
from kernelrl.judge.timing.verdict import Verdict
from kernelrl.judge.trial import Trial, run_trial
from kernelrl.result import Status


def task_arena(session: ReferenceSession, sets: list[InputSet], pool_size: int) -> int:
    """The arena a candidate of this task needs: its largest message (its parameters, one input
    set, the first set's two outputs, the timing pool of `pool_size` sets, a spot check;
    correctness sends one set per message), so it can pin no more memory than that."""
    first = sets[0] if sets else None
    largest = max(sets, key=lambda s: payload_bytes([s.values]) + payload_bytes(s.output), default=None)
    return arena_need(session.loaded.init_inputs, session.loaded.constants, session.state(),
                      [largest.values] if largest else None,
                      {"outputs": [largest.output, largest.output]} if largest else None,
                      [first.values] * pool_size if first else None,
                      {"output": first.output, "inputs": first.values} if first else None)


def check_trials(ctx: JudgeContext, session: ReferenceSession, trials: Iterable[Trial], sets: list[InputSet], *,
                 pool_size: int, lock_waits: list[float], checks: threading.Semaphore) -> None:
    """Builds and correctness of every trial reading did not refuse, `checks` at a time batch-wide;
    each wait for the device's lock goes to `lock_waits`."""
    cfg = ctx.config
    pending = [t for t in trials if t.verdict is None]
    if not pending:
        return
    # A random order: which trial gets the pool's oldest worker, and starts first, is chance.
    session.rng.shuffle(pending)
    session.state()  # fetched once, before candidates ask for it from several threads

    def check(t: Trial) -> None:
        with checks:
            try:
                # On a CPU the whole trial holds the device's lock (shared: builds and checks use
                # the cores being measured); on a GPU only its correctness runs do
                # (`device_work`), so builds overlap measurements.
                with waited(ctx.lock.build(), lock_waits):
                    # The clock starts once the lock lets the work in: waiting for another
                    # group's measurement is not the candidate's time.
                    t.started = time.monotonic()
                    t.worker = ctx.pool.take("candidate", deadline=t.started + cfg.timeout_s, claim=session.claim)
                    t.spans.wait_s = time.monotonic() - t.started
                    t.worker.size_arena(task_arena(session, sets, pool_size))
                    # The task's own program as a copy (the timed reference, the A/A copy,
                    # calibration's copies) runs the first set twice: equal to the reference's
                    # output and to itself is all a copy must show (a task whose outputs vary
                    # from run to run fails there); the other sets test a candidate's answer
                    # on moved inputs, which the task's own code gives by definition.
                    run_trial(t, reference=session, spec=session.spec, sets=sets[:1] if t.trusted else sets,
                              cache_dir=cfg.cache_dir, timeout_s=cfg.timeout_s, build_timeout_s=cfg.build_timeout_s,
                              tol_scale=cfg.tol_scale, device_work=ctx.lock.device_work)
            except Exception as e:  # noqa: BLE001 - the judge's own trouble must not lose the batch
                t.end(Verdict(status=Status.JUDGE_ERROR,
                              message=f"the judge could not run the candidate: {type(e).__name__}: {e}"))

    with ThreadPoolExecutor(max_workers=max(1, min(cfg.concurrency, len(pending)))) as ex:
        list(ex.map(check, pending))
