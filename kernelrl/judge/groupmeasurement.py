"""A group's measurement: the timed reference and the members that passed their checks, in one
interleaved measurement (`kernelrl.judge.timing.timer`), measured again while identical code
disagreed or the device was busy (`measure`).

Guarantees:
- a group is timed only when a member passed its checks (a baseline group always is), and
  measured again (`EvalConfig.aa_retimes` at most) only while a member is left to pay;
- the reference timed is the copy loaded as a program when it passed its checks, else the task's
  own worker, which is then never kept for the task's next group (`ReferenceSession.keepable`);
  the record says which, and why;
- the timing pool goes to every member before the measurement, in a random order, under the
  device's lock shared (beside other groups' checks); each measurement holds it exclusively;
- the A/A copy's speedup and interval, the retimes and whether the group stayed noisy go into
  the timing's record; a candidate whose spot-checked outputs are not what its calls committed
  to is noted (`output_deferred`); the task's baseline is kept where the measurement gave one.

Does not decide verdicts: `kernelrl.judge.results` does, with what this returns.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Mapping

from kernelrl.checks.dynamic import output_deferred
from kernelrl.judge.context import JudgeContext
from kernelrl.judge.grouprecord import GroupRecord, waited
from kernelrl.judge.isolation.sandbox import Worker
from kernelrl.judge.reference import ReferenceFailed, ReferenceSession
from kernelrl.judge.results import record_baseline
from kernelrl.judge.timing.timer import GroupTiming, aa_noisy, measure_group, send_pools
from kernelrl.judge.trial import AA_REFERENCE, COMPILED, TIMED_REFERENCE, Trial
from kernelrl.result import DeviceIdle, ReferenceWorker
from kernelrl.tasks.task import Task


def measure(ctx: JudgeContext, task: Task, session: ReferenceSession, trials: Mapping[str, Trial],
            members: Collection[str], record: GroupRecord, *, pool_size: int, baseline: bool) -> GroupTiming | None:
    """The group's measurement (see the module docstring); None when it is not timed. `members` are
    the keys of the trials a verdict pays; `record` gets the phases, the waits and the reference."""
    cfg = ctx.config
    survivors = {h: t for h, t in trials.items() if t.survived and h != TIMED_REFERENCE}
    # Only a member that passed its checks is worth a measurement: timing the task's own
    # copies (the A/A twin, the compiled baseline) for a group whose members all failed
    # would pay seconds for figures no verdict reads. A baseline group times regardless.
    if not (any(h in members for h in survivors) or baseline):
        return None
    reference = _timed_reference(task, session, trials, record)
    pool = session.timing_pool(pool_size)
    record.reference = dataclasses.replace(record.reference, sets_in_files=session.sets.in_files)
    # Members in a random order: pool and warm-up messages go out in this order.
    order = list(survivors)
    session.rng.shuffle(order)
    workers = {h: w for h in order if (w := survivors[h].worker) is not None}
    # The pool goes to every member before the measurement, beside other groups' checks
    # (copies and noise, no machine to itself needed); a retime reuses it.
    with waited(ctx.lock.work(uses_device=True), record.lock_waits):
        sent = send_pools(reference, workers, pool, cfg.timing, rng=session.rng,
                          deadline=time.monotonic() + cfg.timeout_s)
    record.phase("timing_pool_s")
    aa = AA_REFERENCE in workers
    trusted = frozenset(h for h, t in trials.items() if t.trusted or t.compiled_reference)
    timing_waits: list[float] = []  # one per measurement (a retime waits again)
    retimed = 0
    while True:
        with waited(ctx.lock.timing(), timing_waits):
            deadline = time.monotonic() + cfg.timeout_s + cfg.timing.max_timing_s * max(1, len(survivors))
            timing = measure_group(reference, workers, pool, sent, cfg.timing, rng=session.rng,
                                   deadline=deadline, tol_scale=cfg.tol_scale, tf32=cfg.allow_tf32,
                                   cores=record.cores, idle=ctx.idle, trusted=trusted,
                                   twin=AA_REFERENCE if aa else None)
        noisy = aa and aa_noisy(timing.candidates.get(AA_REFERENCE), cfg.aa_tolerance)
        disturbed = noisy or timing.device_idle is DeviceIdle.BUSY
        # A second measurement is for a member whose speedup would be paid; when every
        # member failed during this one, nothing is left to pay.
        paid = any(h in members and (c := timing.candidates.get(h)) is not None and c.failure is None
                   for h in workers)
        if not disturbed or not paid or retimed >= cfg.aa_retimes:
            break
        retimed += 1  # identical code disagreed, or the device was busy: measure again
    pair = timing.candidates.get(AA_REFERENCE) if aa else None
    record.lock_waits += timing_waits
    measured = dataclasses.replace(timing, device_wait_s=sum(timing_waits), noisy=noisy, retimed=retimed,
                                   aa_speedup=pair.speedup if pair else None, aa_ci=pair.speedup_ci if pair else None)
    record.machine = dataclasses.replace(record.machine, pinned_allocator=timing.allocator_pinned)
    _note_deferred_outputs(survivors)
    record.phase("timing_s")
    stray_ns = sum(w.stray_check_ns for w in [*workers.values(), reference])
    record.phases.update(timing_setup_s=round(timing.setup_s, 3),
                         timing_samples_s=round(timing.samples_s, 3),
                         timing_spot_checks_s=round(timing.spot_checks_s, 3),
                         aa_copy_samples_s=round(timing.twin_samples_s, 3),
                         stray_checks_s=round(stray_ns / 1e9, 3))
    record_baseline(ctx, task, record, measured, trials.get(COMPILED), COMPILED)
    return measured


def _timed_reference(task: Task, session: ReferenceSession, trials: Mapping[str, Trial], record: GroupRecord) -> Worker:
    """The worker whose reference is timed: the reference's copy when it passed its checks.

    A copy that failed (a reference whose outputs vary from run to run beyond the tolerance,
    say) leaves the task worker to be timed, and the record says why.
    """
    copy = trials.get(TIMED_REFERENCE)
    if copy is not None and copy.survived and copy.worker is not None:
        record.reference = dataclasses.replace(record.reference, timed_in=ReferenceWorker.PROGRAM)
        return copy.worker
    failed = copy.verdict.message if copy is not None and copy.verdict is not None else ""
    record.reference = dataclasses.replace(record.reference, timed_in=ReferenceWorker.TASK, copy_failed=failed)
    session.keepable = False  # a timed worker's history is not a fresh load's
    if session.worker is None:
        raise ReferenceFailed(f"{task.name}: the reference worker is gone")
    return session.worker


def _note_deferred_outputs(survivors: Mapping[str, Trial]) -> None:
    """A candidate whose spot-checked outputs are not what its calls committed to made them later."""
    for t in survivors.values():
        if t.worker is not None and (found := output_deferred(t.worker.uncommitted_outputs,
                                                              t.worker.spot_outputs)) is not None:
            t.findings.append(found)
