"""A group: one task's candidates of a batch, judged together, and how a batch's groups are scheduled.

A group goes through three steps:
- `prepare`: the reference worker loads the task and gives its outputs on the secret input sets
  (`kernelrl.judge.reference`); a degenerate task ends here (every candidate flagged); then every
  candidate's static checks, build and correctness (`kernelrl.judge.trial`), and the compiled
  reference when a baseline is wanted;
- `time`: the reference and the survivors in one interleaved measurement (`kernelrl.judge.timer`),
  holding the device's lane exclusively;
- `finish`: verdicts, handed to the batch's `done` callback as they are ready.

`run_groups` schedules a batch: on a CPU the groups are prepared `width` at a time and timed one
after another, so the cores that builds and checks use are never busy while a measurement runs;
on a GPU each group runs whole in its own thread, and the lane keeps measurements on one GPU
apart while builds (on the CPU) overlap them. Candidate checks of all groups share one limit of
`width` at a time.

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
        survivors = {h: t for h, t in self.trials.items() if t.survived}
        try:
            if survivors or self.baseline:
                pool = self.session.timing_pool(cfg.timing.pool_size)
                self._phase("timing_pool")
                with ev.lane.timing():
                    deadline = time.monotonic() + cfg.timeout_s + cfg.timing.max_timing_s * max(1, len(survivors))
                    self.timing = measure_group(self.session.worker, {h: t.worker for h, t in survivors.items()},
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
        self.session.state()  # fetched once, before candidates ask for it from several threads

        def check(t: Trial) -> None:
            with checks:
                t.started = time.monotonic()
                try:
                    with ev.lane.work(uses_device=True):
                        t.worker = ev.pool.take("candidate", deadline=t.started + cfg.timeout_s)
                        run_trial(t, reference=self.session, spec=self.session.spec, sets=self.sets,
                                  cache_dir=cfg.cache_dir, timeout_s=cfg.timeout_s, tol_scale=cfg.tol_scale)
                except Exception as e:  # noqa: BLE001 - the judge's own trouble must not lose the batch
                    t.end(Verdict(status=Status.RUNTIME_ERROR,
                                  message=f"the judge could not run the candidate: {type(e).__name__}: {e}"))

        with ThreadPoolExecutor(max_workers=max(1, min(cfg.concurrency, len(pending)))) as ex:
            list(ex.map(check, pending))


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

    try:
        if device != Device.CPU:
            with ThreadPoolExecutor(max_workers=max(1, min(width, len(groups)))) as ex:
                list(ex.map(whole, groups))
            return
        # CPU: prepare a chunk of groups side by side, then time them one after another.
        step = max(1, width)
        for start in range(0, len(groups), step):
            chunk = groups[start:start + step]
            with ThreadPoolExecutor(max_workers=len(chunk)) as ex:
                list(ex.map(lambda g: g.prepare(checks), chunk))
            for g in chunk:
                g.time()
                g.finish()
    finally:
        for g in groups:
            g.close()
