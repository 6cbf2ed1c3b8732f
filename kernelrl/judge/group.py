"""A group: one task's candidates of a batch, judged together, and how a batch's groups are scheduled.

A group is built from a `JudgeContext` (`kernelrl.judge.context`: config, pool, device lock,
secrets, task store, baselines, peaks, reviewer) and goes through three steps:
- `prepare`: every member is read first (syntax, static rules under the policy, its language on
  the device): a group whose members are all refused by reading ends there, and its reference
  never loads. Otherwise the reference worker loads the task and gives its outputs on the secret
  input sets (`kernelrl.judge.reference`); a degenerate task ends here (every candidate flagged);
  then every candidate still standing is built and checked (`kernelrl.judge.groupchecks`, each
  a trial: `kernelrl.judge.trial`), and the compiled reference when a baseline is wanted;
- `time`: the reference and the survivors in one interleaved measurement, holding the device's
  lock exclusively, measured again while identical code disagreed (`kernelrl.judge.groupmeasurement`,
  through `kernelrl.judge.timing.timer`);
- `finish`: the floors and the LLM review each survivor needs, then its verdict
  (`kernelrl.judge.results`, then `kernelrl.judge.timing.verdict`, pure), handed to the batch's
  `done` callback as it is ready.

A group holds what its caller asked (`Asked`), what it learned as it went (`Learned`: the task's
facts, its sets, the measurement), its trials, and what its results record (`GroupRecord`).

`run_groups` schedules a batch: each group runs whole in a thread of its own, a few groups at a
time (`context.Places`: an evaluator's batches given at once share them), and each is timed as
soon as its checks are done. The device lock
(`kernelrl.judge.timing.devicelock`) keeps measurements apart from everything that would disturb them:
on a CPU no build or check starts while a measurement waits or runs (those under way finish
first), so the cores are never shared with a measurement, and no group waits for another group's
checks; on a GPU only work on that GPU is held back, and builds (on the CPU) overlap
measurements. Candidate checks of all groups share one limit of `width` at a time, across batches.

Guarantees: a group never raises for a candidate's or its task's fault: a task that cannot be
loaded or run gives every candidate of the group that reading did not refuse a `task_error`
result (a refused one keeps its verdict, whatever its group-mates are); every worker a group
started is closed when it ends.

Does not decide verdicts: `kernelrl.judge.timing.verdict` does, with what a group measured.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from kernelrl.candidate import Candidate
from kernelrl.judge.context import JudgeContext, Places
from kernelrl.judge.groupchecks import check_trials
from kernelrl.judge.groupmeasurement import measure
from kernelrl.judge.grouprecord import GroupRecord, waited
from kernelrl.judge.harness.channel import payload_bytes
from kernelrl.judge.harness.device import Device
from kernelrl.judge.isolation.pool import Claim
from kernelrl.judge.reference import (
    InputSet,
    ReferenceFailed,
    ReferenceSession,
    TaskInfo,
    check_size,
    session_for,
)
from kernelrl.judge.results import member_result
from kernelrl.judge.timing import verdict as V
from kernelrl.judge.timing.inputs import timing_pool_size
from kernelrl.judge.timing.timer import GroupTiming, ReferenceTimingFailed
from kernelrl.judge.trial import AA_REFERENCE, COMPILED, TIMED_REFERENCE, Trial, read_members, reference_program
from kernelrl.result import Environment, EvalResult, GroupPhases
from kernelrl.tasks.degeneracy import DEFAULT_TOLERANCE, outputs_degenerate
from kernelrl.tasks.task import Task, TaskError

Done = Callable[[list[int], EvalResult], None]
Members = dict[str, tuple[Candidate, list[int]]]  # candidate hash -> (candidate, positions in the batch)


def load_task_info(ctx: JudgeContext, session: ReferenceSession, task: Task,
                   waits: list[float] | None = None) -> TaskInfo:
    """Load the task in its reference worker; what was learned of it comes from the store, or is
    learned now (constants, profile) and stored. The wait for the device's lock goes to `waits`."""
    info = ctx.tasks.get(task)
    with waited(ctx.lock.work(uses_device=True), [] if waits is None else waits):
        session.load(constants=info.constants if info else None, profile=info is None)
    if info is None:
        info = TaskInfo(constants=session.loaded.constants, profile=session.loaded.profile)
        ctx.tasks.put(task, info)
    return info


@dataclasses.dataclass(frozen=True)
class Asked:
    """What the caller asked of a group: a baseline (the compiled reference timed too, when `compile`),
    and the members it vouched for (calibration's copies: timed as trusted, paid nothing)."""

    baseline: bool = False
    compile: bool = True
    trusted: frozenset[str] = frozenset()


@dataclasses.dataclass
class Learned:
    """What a group learned as it went: the task's facts, its correctness sets, and the measurement."""

    info: TaskInfo | None = None
    sets: list[InputSet] = dataclasses.field(default_factory=list)
    timing: GroupTiming | None = None


class Group:
    def __init__(self, ctx: JudgeContext, task: Task, members: Members, done: Done, *,
                 baseline: bool = False, compile: bool = True, trusted: frozenset[str] = frozenset()) -> None:
        self.ctx = ctx
        self.task = task
        self.members = dict(members)
        self.done = done
        self.asked = Asked(baseline=baseline, compile=compile, trusted=trusted)
        # the task's worker kept from an earlier group, if any: reseeded instead of a fresh load; its
        # generator (`session.rng`) is the group's secret one, and its claim (`session.claim`) the
        # workers the group told the pool it will take (`run_groups`)
        self.session = session_for(task, ctx.config, pool=ctx.pool, rng=ctx.secrets.generator(),
                                   kept=ctx.references.take(task))
        self.trials: dict[str, Trial] = {}
        self.learned = Learned()
        # Why the task itself failed (its reference), if it did: a baseline group has no member to
        # tell, so its caller reads it here.
        self.failure: str | None = None
        self.finished = False
        self.record = GroupRecord(ctx, task)  # what its results record of how they were obtained

    def workers_wanted(self) -> int:
        """How many workers this group will still take, as far as it knows: its reference's (until
        loaded), one per member reading did not refuse, the timed reference, the A/A copy and the
        compiled reference where they will be wanted."""
        cfg = self.ctx.config
        live = sum(1 for h in self.members if (t := self.trials.get(h)) is None or t.verdict is None)
        if not live and not self.asked.baseline:
            return 0
        timed = 1 + live + (1 if live and cfg.aa_tolerance > 0 else 0) + (1 if self._wants_compile() else 0)
        return timed + (1 if self.session.worker is None and self.session.kept is None else 0)

    def _wants_compile(self) -> bool:
        """Whether the compiled reference is timed in this group (a baseline not yet known)."""
        cfg = self.ctx.config
        known = self.ctx.baselines.get(self.ctx.tasks.key(self.task))
        return (cfg.compile_baseline or (self.asked.baseline and self.asked.compile)) and (
            known is None or (known.compile_ms is None and not known.compile_error))

    def use_claim(self, claim: Claim) -> None:
        """Count the group's takes against `claim` (the pool starts no spare beyond it)."""
        self.session.claim = claim

    def _pool_size(self) -> int:
        """The timing pool's sets (`timing_pool_size`: one for a task whose set outgrows the caches)."""
        configured = self.ctx.config.timing.pool_size
        return timing_pool_size(configured, payload_bytes(self.learned.sets[0].values)) if self.learned.sets else configured

    def begin(self) -> None:
        """The group has its place among those judged at once: what it waited for that is `queued_s`."""
        self.record.phase("queued_s")

    def environment(self) -> Environment:
        """What every result of this group records about how it was obtained (so far)."""
        return self.record.environment()

    # -- the three steps ----------------------------------------------------------------------

    def prepare(self, checks: threading.Semaphore) -> None:
        ctx, cfg, task = self.ctx, self.ctx.config, self.task
        for h, (cand, _) in self.members.items():
            self.trials[h] = Trial(candidate=cand, trusted=h in self.asked.trusted)
        read_members(self.trials.values(), ctx.config, task.source)
        if self.session.claim is not None:  # members reading refused take no worker
            ctx.pool.expect(self.session.claim, self.workers_wanted())
        if self.members and not self.asked.baseline and all(self.trials[h].verdict is not None for h in self.members):
            # Every member was refused by reading it (a syntax error, a rejecting static rule, a
            # language the device cannot run): no verdict needs the reference, so it never loads.
            self.record.phase("candidate_checks_s")
            self.finish()
            return
        try:
            info = load_task_info(ctx, self.session, task, self.record.lock_waits)
            self.record.phase("reference_load_s")
            check_size(cfg, self.session, task, info.profile)
            self.record.machine = dataclasses.replace(self.record.machine, precision=dict(self.session.loaded.precision))
            self.record.reference = dataclasses.replace(self.record.reference, reseeded=self.session.loaded.reseeded)
            if not info.degenerate:
                # A group of the task's own programs only (a baseline, a calibration) pays no one: one
                # plain set checks the compiled reference; the perturbed ones are for candidates.
                # At full size a set is the task's whole inputs (2 GiB for KernelBench's KLDivLoss).
                n_sets = cfg.n_correctness if any(h not in self.asked.trusted for h in self.members) else 1
                with waited(ctx.lock.work(uses_device=True), self.record.lock_waits):
                    self.learned.sets = self.session.correctness_sets(n_sets)
                self.record.phase("reference_outputs_s")
                reasons = outputs_degenerate([s.output for s in self.learned.sets], DEFAULT_TOLERANCE)
                if reasons:
                    info = dataclasses.replace(info, degenerate=tuple(reasons))
                    ctx.tasks.put(task, info)
            self.learned.info = info
            if info.degenerate:
                # Whatever a candidate does, a constant would pass: nothing of this task is paid.
                for cand, positions in self.members.values():
                    self.done(positions, V.degenerate(self.record.setting, cand.hash, info.degenerate, self.environment()))
                self.members = {}
                if not self.asked.baseline:
                    self.finished = True
                    return
            self.record.machine = dataclasses.replace(
                self.record.machine, proc_isolation=self.session.worker.isolated if self.session.worker else None)
            self.record.reference = dataclasses.replace(self.record.reference,
                                                 perturbed_sets=sum(s.plan.perturbed for s in self.learned.sets),
                                                 sets_in_files=self.session.sets.in_files)
            want_compile = self._wants_compile()
            if self.members or self.asked.baseline:
                self.trials[TIMED_REFERENCE] = Trial(candidate=reference_program(task), trusted=True)
            if self.members and cfg.aa_tolerance > 0:
                self.trials[AA_REFERENCE] = Trial(candidate=reference_program(task, copy="the A/A copy"), trusted=True)
            if want_compile:
                self.trials[COMPILED] = Trial(candidate=Candidate(source=f"# torch.compile of {task.name}\n"),
                                              compiled_reference=True)
            check_trials(ctx, self.session, self.trials.values(), self.learned.sets, pool_size=self._pool_size(),
                         lock_waits=self.record.lock_waits, checks=checks)
            self.record.phase("candidate_checks_s")
            self.record.note_check_times([t for h, t in self.trials.items() if h in self.members],
                                         self.trials.get(TIMED_REFERENCE), self.trials.get(AA_REFERENCE),
                                         self.trials.get(COMPILED))
        except (ReferenceFailed, ReferenceTimingFailed, TaskError) as e:
            self._task_error(e)

    def time(self) -> None:
        if self.finished:
            return
        try:
            self.learned.timing = measure(self.ctx, self.task, self.session, self.trials, self.members, self.record,
                                          pool_size=self._pool_size(), baseline=self.asked.baseline)
        except (ReferenceFailed, ReferenceTimingFailed, TaskError) as e:
            self._task_error(e)

    def finish(self) -> None:
        if not self.finished:
            clock = time.monotonic()
            verdicts = [(positions, member_result(self.ctx, self.task, self.record, self.learned.timing, self.learned.info,
                                                        self.trials[h])) for h, (_, positions) in self.members.items()]
            # The verdicts' own time goes into what they record (each was made with the phases so far).
            self.record.phases["verdict_s"] = round(time.monotonic() - clock, 3)
            phases = GroupPhases(**self.record.phases)
            for positions, result in verdicts:
                self.done(positions, dataclasses.replace(
                    result, environment=dataclasses.replace(result.environment, phases=phases)))
            self.finished = True
        self.close()

    def close(self) -> None:
        for t in self.trials.values():
            t.close()
        self.ctx.references.release(self.task, self.session)  # kept for the task's next group where it may be

    def _task_error(self, e: Exception) -> None:
        self.failure = str(e)
        self.session.keepable = False
        env = self.environment()
        for h, (cand, positions) in self.members.items():
            read = self.trials.get(h)
            # A member refused by reading keeps that verdict: it never depended on the task loading.
            self.done(positions, V.early(self.record.setting, read.checked(), read.verdict, env)
                      if read is not None and read.verdict is not None
                      else V.task_error(self.record.setting, cand.hash, str(e), env))
        self.finished = True
        self.close()

def run_groups(groups: Sequence[Group], *, device: Device, width: int,
               on_closed: Callable[[Group], None] | None = None) -> None:
    """Judge a batch's groups (see the module docstring); every group is finished and closed.
    `on_closed(group)` runs as each group closes, finished or failed, so a caller can report it
    before the slowest group of the batch ends. The groups take their places from their context's
    `Places` (shared with the evaluator's other batches), or from places of this batch's own."""
    own = Places(device=device, width=width)

    def whole(g: Group) -> None:
        places = g.ctx.places or own
        with places.groups:  # groups in flight bound the workers alive
            g.begin()
            # The pool starts what the group will take as it begins, and no spare while it runs
            # (a start would hold back its measurement); it tops up once no group is left.
            with g.ctx.pool.claim(g.workers_wanted()) as claim:
                g.use_claim(claim)
                try:
                    g.prepare(places.checks)
                    g.time()
                    g.finish()
                finally:
                    g.close()
                    if on_closed is not None:
                        on_closed(g)

    try:
        # A thread per group, each waiting for its place: first asked, first served.
        with ThreadPoolExecutor(max_workers=max(1, len(groups))) as ex:
            list(ex.map(whole, groups))
    finally:
        for g in groups:
            g.close()


def run_group(ctx: JudgeContext, task: Task, members: Members, done: Done, *, baseline: bool = False,
              compile: bool = True, trusted: frozenset[str] = frozenset()) -> None:
    """One task's group from start to end (baselines and calibration use it)."""
    run_groups([Group(ctx, task, members, done, baseline=baseline, compile=compile, trusted=trusted)],
               device=ctx.config.device, width=1)
