"""A group: one task's candidates of a batch, judged together, and how a batch's groups are scheduled.

A group goes through three steps:
- `prepare`: the reference worker loads the task and gives its outputs on the secret input sets
  (`kernelrl.judge.reference`); a degenerate task ends here (every candidate flagged); then every
  candidate's static checks, build and correctness (`kernelrl.judge.trial`), and the compiled
  reference when a baseline is wanted;
- `time`: the reference and the survivors in one interleaved measurement (`kernelrl.judge.timer`),
  holding the device's lane exclusively;
- `finish`: verdicts, handed to the batch's `done` callback as they are ready.

`run_groups` schedules a batch: each group runs whole in a thread of its own, a few groups at a
time, and each is timed as soon as its checks are done. The lane (`kernelrl.judge.lanes`) keeps
measurements apart from everything that would disturb them: on a CPU no build or check starts
while a measurement waits or runs (those under way finish first), so the cores are never shared
with a measurement, and no group waits for another group's checks; on a GPU only work on that
GPU is held back, and builds (on the CPU) overlap measurements. Candidate checks of all groups
share one limit of `width` at a time.

Guarantees: a group never raises for a candidate's or its task's fault: a task that cannot be
loaded or run gives every candidate of the group a `task_error` result; every worker a group
started is closed when it ends.

Does not decide verdicts: `kernelrl.judge.evaluator` does, with what a group measured.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from kernelrl.candidate import Candidate
from kernelrl.checks import dynamic
from kernelrl.checks.policy import get_policy
from kernelrl.judge.device import Device
from kernelrl.judge.reference import InputSet, ReferenceFailed, TaskInfo
from kernelrl.judge.sandbox import timing_cores
from kernelrl.judge.timer import GroupTiming, ReferenceTimingFailed, measure_group
from kernelrl.judge.trial import Trial, Verdict, first_line, run_trial, static_verdict
from kernelrl.result import EvalResult, Status
from kernelrl.tasks.degeneracy import DEFAULT_TOLERANCE, outputs_degenerate
from kernelrl.tasks.task import Task, TaskError

if TYPE_CHECKING:
    from kernelrl.judge.evaluator import Evaluator

COMPILED = "__compiled_reference__"  # the trial key of the task's reference under torch.compile
# The trial key of the task's reference loaded as a program, exactly as candidates are: it is the
# reference that is timed, so the reference and the candidates are measured in processes with
# the same history (a fresh pool worker, a program load, the correctness runs), never in the task
# worker that made the inputs and outputs (which measured up to 30 % slower: benchmarks/README.md).
TIMED_REFERENCE = "__timed_reference__"

Done = Callable[[list[int], EvalResult], None]


class Group:
    def __init__(self, ev: Evaluator, task: Task, members: dict[str, tuple[Candidate, list[int]]], done: Done, *,
                 baseline: bool = False, compile: bool = True, trusted: frozenset[str] = frozenset()) -> None:
        cfg = ev.config
        self.ev = ev
        self.task = task
        self.members = dict(members)
        self.done = done
        self.baseline = baseline
        self.compile = compile
        self.trusted = trusted
        self.rng = ev._secret()
        self.session = ev._session(task, self.rng)
        self.trials: dict[str, Trial] = {}
        self.sets: list[InputSet] = []
        self.info: TaskInfo | None = None
        self.known = None
        self.timing: GroupTiming | None = None
        self.finished = False
        self.phases: dict[str, float] = {}  # where the group's wall time went, in seconds
        self.cores = timing_cores(cfg.sandbox)
        self.env: dict[str, Any] = {"threads": cfg.sandbox.effective_threads, "lane": ev.lane.name,
                                    "pinned_allocator": cfg.sandbox.pin_allocator, "group_phases_s": self.phases,
                                    "timing_cores": sorted(self.cores or [])}
        self._clock = time.monotonic()

    def _phase(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = round(self.phases.get(name, 0.0) + now - self._clock, 3)
        self._clock = now

    # -- the three steps ----------------------------------------------------------------------

    def prepare(self, checks: threading.Semaphore) -> None:
        ev, cfg, task = self.ev, self.ev.config, self.task
        try:
            info = ev._load(self.session, task)
            self._phase("reference_load")
            if not info.degenerate:
                with ev.lane.work(uses_device=True):
                    self.sets = self.session.correctness_sets(cfg.n_correctness)
                self._phase("reference_outputs")
                reasons = outputs_degenerate([s.output for s in self.sets], DEFAULT_TOLERANCE)
                if reasons:
                    info = dataclasses.replace(info, degenerate=tuple(reasons))
                    ev._store_info(task, info)
            self.info = info
            if info.degenerate:
                # Whatever a candidate does, a constant would pass: nothing of this task is paid.
                finding = dynamic.degenerate_task(info.degenerate)
                assert finding is not None
                for cand, positions in self.members.values():
                    self.done(positions, ev._result(task, cand, Verdict(status=Status.FLAGGED, message=(
                        f"flagged: degenerate_task ({'; '.join(info.degenerate)})")), [finding], {}, self.env))
                self.members = {}
                if not self.baseline:
                    self.finished = True
                    return
            self.env["perturbed_sets"] = sum(s.plan.perturbed for s in self.sets)
            self.env["proc_isolation"] = self.session.worker.isolated if self.session.worker else None
            self.known = ev.cached_baseline(task)
            want_compile = (cfg.compile_baseline or (self.baseline and self.compile)) and (
                self.known is None or (self.known.compile_ms is None and not self.known.compile_error))
            for h, (cand, _) in self.members.items():
                self.trials[h] = Trial(candidate=cand, trusted=h in self.trusted)
            if self.members or self.baseline:
                self.trials[TIMED_REFERENCE] = Trial(candidate=reference_program(task), trusted=True)
            if want_compile:
                self.trials[COMPILED] = Trial(candidate=Candidate(source=f"# torch.compile of {task.name}\n"),
                                              compiled_reference=True)
            self._check_all(checks)
            self._phase("candidate_checks")
        except (ReferenceFailed, ReferenceTimingFailed, TaskError) as e:
            self._task_error(e)

    def time(self) -> None:
        if self.finished:
            return
        ev, cfg = self.ev, self.ev.config
        survivors = {h: t for h, t in self.trials.items() if t.survived and h != TIMED_REFERENCE}
        try:
            if survivors or self.baseline:
                reference = self._timed_reference()
                pool = self.session.timing_pool(cfg.timing.pool_size)
                self._phase("timing_pool")
                # Members in a random order: pool and warm-up messages go out in this order.
                order = list(survivors)
                self.rng.shuffle(order)
                with ev.lane.timing():
                    deadline = time.monotonic() + cfg.timeout_s + cfg.timing.max_timing_s * max(1, len(survivors))
                    self.timing = measure_group(reference, {h: survivors[h].worker for h in order},
                                                pool, cfg.timing, rng=self.rng, deadline=deadline,
                                                tol_scale=cfg.tol_scale, cores=self.cores)
                self._phase("timing")
                ev._record_baseline(self.task, self.timing, self.trials.get(COMPILED), self.known)
        except (ReferenceFailed, ReferenceTimingFailed, TaskError) as e:
            self._task_error(e)

    def finish(self) -> None:
        if not self.finished:
            assert self.info is not None
            for h, (_, positions) in self.members.items():
                self.done(positions, self.ev._finish(self.task, self.trials[h], self.timing, self.info, self.env))
            self.finished = True
        self.close()

    def close(self) -> None:
        for t in self.trials.values():
            t.close()
        self.session.close()

    # -- parts --------------------------------------------------------------------------------

    def _timed_reference(self) -> Any:
        """The worker whose reference is timed: the reference's copy when it passed its checks.

        A copy that failed (a reference whose outputs vary from run to run beyond the tolerance,
        say) leaves the task worker to be timed, and the record says why.
        """
        copy = self.trials.get(TIMED_REFERENCE)
        if copy is not None and copy.survived:
            self.env["reference_timed_in"] = "program_worker"
            return copy.worker
        self.env["reference_timed_in"] = "task_worker"
        if copy is not None and copy.verdict is not None:
            self.env["reference_copy_failed"] = copy.verdict.message
        return self.session.worker

    def _task_error(self, e: Exception) -> None:
        cfg = self.ev.config
        for cand, positions in self.members.values():
            self.done(positions, EvalResult(task=self.task.name, status=Status.TASK_ERROR, message=first_line(str(e)),
                                            errors=[str(e)], device=cfg.device, size=cfg.size, policy=cfg.policy,
                                            candidate_hash=cand.hash, environment=dict(self.env)))
        self.finished = True
        self.close()
        if self.baseline:
            raise ReferenceFailed(str(e)) from e

    def _check_all(self, checks: threading.Semaphore) -> None:
        """Static checks, builds and correctness of every candidate, `checks` at a time batch-wide."""
        ev, cfg, task = self.ev, self.ev.config, self.task
        policy = get_policy(cfg.policy)
        for t in self.trials.values():
            if t.compiled_reference or t.trusted:
                continue
            try:
                if cfg.static_checks:
                    from kernelrl.checks.static import check_source

                    t.findings.extend(policy.apply(check_source(t.candidate.source, task_source=task.source)))
                verdict = static_verdict(t.candidate.source, t.candidate.language, device=cfg.device,
                                         static_findings=t.findings)
            except (RecursionError, MemoryError) as e:
                # Nesting deep enough to exhaust the parser is a program that does not build.
                verdict = Verdict(status=Status.COMPILE_ERROR,
                                  message=f"candidate cannot be parsed: {type(e).__name__} (nested too deeply)")
            if verdict is not None:
                t.end(verdict)
        pending = [t for t in self.trials.values() if t.verdict is None]
        if not pending:
            return
        # A random order: which trial gets the pool's oldest worker, and starts first, is chance.
        self.rng.shuffle(pending)
        self.session.state()  # fetched once, before candidates ask for it from several threads

        def check(t: Trial) -> None:
            with checks:
                try:
                    with ev.lane.work(uses_device=True):
                        # The clock starts once the lane lets the work in: waiting for another
                        # group's measurement is not the candidate's time.
                        t.started = time.monotonic()
                        t.worker = ev.pool.take("candidate", deadline=t.started + cfg.timeout_s)
                        run_trial(t, reference=self.session, spec=self.session.spec, sets=self.sets,
                                  cache_dir=cfg.cache_dir, timeout_s=cfg.timeout_s, build_timeout_s=cfg.build_timeout_s,
                                  tol_scale=cfg.tol_scale)
                except Exception as e:  # noqa: BLE001 - the judge's own trouble must not lose the batch
                    t.end(Verdict(status=Status.RUNTIME_ERROR,
                                  message=f"the judge could not run the candidate: {type(e).__name__}: {e}"))

        with ThreadPoolExecutor(max_workers=max(1, min(cfg.concurrency, len(pending)))) as ex:
            list(ex.map(check, pending))


def reference_program(task: Task) -> Candidate:
    """The task's reference as a program: its own source, with `ModelNew` naming `Model`."""
    return Candidate(source=task.source + "\n\n# the task's reference, loaded as a program\nModelNew = Model\n")


def run_groups(groups: Sequence[Group], *, device: str, width: int) -> None:
    """Judge a batch's groups (see the module docstring); every group is finished and closed."""
    checks = threading.Semaphore(max(1, width))

    def whole(g: Group) -> None:
        try:
            g.prepare(checks)
            g.time()
            g.finish()
        finally:
            g.close()

    # On a CPU one group more than `width`: while one is timed (and holds the machine), `width`
    # others are ready to check as soon as it is done. Groups in flight bound the workers alive.
    in_flight = max(1, width) + (1 if device == Device.CPU else 0)
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(in_flight, len(groups)))) as ex:
            list(ex.map(whole, groups))
    finally:
        for g in groups:
            g.close()
