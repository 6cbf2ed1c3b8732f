"""The evaluator: the reward. One long-lived object that judges candidates, one or a batch at a time.

`Evaluator(config)` holds the configuration and builds the parts every group is judged with (a
`JudgeContext`: a pool of warm workers, the device's lock, the secret generator, the task and
baseline stores, the machine's measured peaks, the optional LLM reviewer, on a GPU the idle probe)
and its result cache.
`evaluate_batch([(task, candidate), ...])` judges many candidates and returns their results in
order; `evaluate(task, candidate)` judges one.

Process model (see the design notes, evaluator protocol):
- the judge (this process) draws the secret seeds, holds the reference's outputs and decides the
  verdict; no program under test and no task code runs here;
- each task's reference runs in a worker of its own (`kernelrl.judge.reference`), which also makes
  every input set from the judge's seeds; each candidate runs in a fresh worker no other program
  touched (`kernelrl.judge.trial`), so no candidate can read the reference's outputs (not even from
  freed memory) or another candidate's;
- candidates of one task are checked in parallel (`concurrency`), then timed together with the
  reference in one interleaved measurement (`kernelrl.judge.timing.timer`), holding the device's lock
  exclusively (`kernelrl.judge.timing.devicelock`); the reference is timed once per group;
- a task whose reference always gives the same output flags every candidate `degenerate_task`,
  with no speedup; a task whose reference cannot load or run gives `task_error` results;
- measured facts become findings in `kernelrl.checks.dynamic`, the verdict is decided by the pure
  `kernelrl.judge.timing.verdict`, and the policy decides which findings reject; every crash, hang, exit
  or OOM of a candidate is a verdict, never an exception here.

Guarantees: results are cached by `kernelrl.judge.reuse.JudgedKey` (task name and source, candidate
source, config fingerprint, which holds size, device and policy) and reused by its one rule (a
`judge_error` or `task_error` is judged again): the same program is judged once per evaluator; a
batch never raises for a candidate's or a task's fault.

Does not guarantee timings are comparable across machines or across runs under other load:
speedups are ratios measured side by side, which is what it guarantees to be fair.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from functools import partial

from kernelrl.candidate import Candidate
from kernelrl.checks.llm_judge import CACHE_FILE as LLM_JUDGE_CACHE
from kernelrl.checks.llm_judge import LLMJudge
from kernelrl.judge.calibration import Calibration, calibrate, noise_band
from kernelrl.judge.context import JudgeContext, Places, Secrets, TaskStore
from kernelrl.judge.eval_config import EvalConfig, config_fingerprint, default_cache_dir
from kernelrl.judge.group import Group, load_task_info, run_groups
from kernelrl.judge.harness.device import Device, visible_device
from kernelrl.judge.harness.profile import TaskProfile
from kernelrl.judge.isolation.ahead import Ahead
from kernelrl.judge.isolation.pool import WorkerPool
from kernelrl.judge.isolation.sandbox import worker_env
from kernelrl.judge.reference import ReferenceFailed, ReferenceKeeper, ReferenceSession, TaskInfo, session_for
from kernelrl.judge.reuse import JudgedKey, ResultCache, judged_before
from kernelrl.judge.timing.baseline import Baseline, BaselineStore
from kernelrl.judge.timing.devicelock import DeviceLock
from kernelrl.judge.timing.idle import CudaProbe, IdleMonitor
from kernelrl.judge.timing.inputs import InputPlan
from kernelrl.judge.timing.roofline import MachinePeaks, PeakStore
from kernelrl.result import EvalResult
from kernelrl.tasks.task import Task

__all__ = ["EvalConfig", "Evaluator", "ReferenceFailed", "config_fingerprint", "default_cache_dir", "evaluate",
           "measure_baseline"]


class Evaluator:
    """See the module docstring. Safe to use from several threads; close it when done."""

    # Results kept per evaluator: enough for any batch and its repeats; the oldest go first, so a
    # long-lived server's memory stays bounded.
    RESULT_CACHE_SIZE = 8192

    def __init__(self, config: EvalConfig | None = None, *, warm_workers: int | None = None) -> None:
        cfg = self.config = config or EvalConfig()
        self.fingerprint = config_fingerprint(cfg)
        self._results = ResultCache(self.RESULT_CACHE_SIZE)
        self._guard = threading.Lock()
        lock = DeviceLock(cfg.cache_dir, cfg.device, cfg.device_index)
        # Enough started workers for a reference and `concurrency` candidates at once.
        # inductor's ISA check and precompiled torch headers, shown read-only to every worker
        self.ahead = Ahead(cache_dir=cfg.cache_dir, headers_root=cfg.headers_root,
                           worker_env=partial(worker_env, cfg.sandbox, cfg.cache_dir), hold=lock.build)
        sandbox = dataclasses.replace(cfg.sandbox, expose=(*cfg.sandbox.expose, *self.ahead.shown))
        pool = WorkerPool(config=sandbox, device=cfg.device, device_index=cfg.device_index,
                          size=cfg.concurrency + 1 if warm_workers is None else warm_workers,
                          starting=lambda: lock.work(uses_device=False))
        pool.warn_if_uncontained()  # one line at start when workers are less than fully contained
        reviewer = None
        if cfg.llm_judge.enabled:
            reviewer = LLMJudge(dataclasses.replace(cfg.llm_judge, cache_path=cfg.cache_dir / LLM_JUDGE_CACHE))
        self.context = JudgeContext(
            config=cfg, fingerprint=self.fingerprint, pool=pool, lock=lock, secrets=Secrets(), tasks=TaskStore(cfg),
            baselines=BaselineStore(),
            peaks=PeakStore(enabled=cfg.roofline, device=cfg.device, sandbox=cfg.sandbox, cache_dir=cfg.cache_dir,
                            device_index=cfg.device_index, lock=lock),
            reviewer=reviewer,
            # a process of the judge's own on the lane's GPU, started at the first measurement
            idle=IdleMonitor(CudaProbe(visible_device(cfg.device_index or 0))) if cfg.device is Device.CUDA else None,
            references=ReferenceKeeper(size=cfg.kept_references), places=Places(device=cfg.device, width=cfg.concurrency))
        self.evaluations = 0  # candidates judged (cache hits excluded)

    @property
    def pool(self) -> WorkerPool:
        return self.context.pool

    @property
    def lock(self) -> DeviceLock:
        return self.context.lock

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        # The pool first: it tops up a second after a batch's claim closes, and ending the kept
        # reference workers can take longer than that on a busy machine; a pool closed first
        # starts no worker only to kill it.
        self.context.pool.close()
        self.context.references.close()
        if self.context.idle is not None:
            self.context.idle.close()

    # -- judging ------------------------------------------------------------------------------

    def evaluate(self, task: Task, candidate: Candidate | str) -> EvalResult:
        return self.evaluate_batch([(task, candidate)])[0]

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]], *,
                       on_result: Callable[[int, EvalResult], None] | None = None) -> list[EvalResult]:
        """Judge every (task, candidate) pair; results in the order given. Never raises for a
        candidate's or a task's fault."""
        pairs = [(task, Candidate(source=c) if isinstance(c, str) else c) for task, c in items]
        self.ahead.before([c.source for _, c in pairs], compiles=self.config.compile_baseline)
        results: list[EvalResult | None] = [None] * len(pairs)
        todo: dict[str, dict[str, list[int]]] = {}  # task key -> candidate hash -> positions
        tasks: dict[str, Task] = {}
        for i, (task, cand) in enumerate(pairs):
            known = judged_before(self._results, self._key(task, cand))
            if known is not None:
                again = dataclasses.replace(known.result, environment=dataclasses.replace(
                    known.result.environment, cached=True))
                results[i] = again
                if on_result:
                    on_result(i, again)
                continue
            key = self.context.tasks.key(task)
            tasks[key] = task
            todo.setdefault(key, {}).setdefault(cand.hash, []).append(i)

        def done(positions: list[int], res: EvalResult) -> None:
            task, cand = pairs[positions[0]]
            self._results.remember(self._key(task, cand), res)  # a judge_error or task_error is not kept
            with self._guard:
                self.evaluations += 1
            for i in positions:
                results[i] = res
                if on_result:
                    on_result(i, res)

        groups = [Group(self.context, tasks[k], {h: (pairs[pos[0]][1], pos) for h, pos in by_hash.items()}, done)
                  for k, by_hash in todo.items()]
        run_groups(groups, device=self.config.device, width=self.config.concurrency)
        return [r for r in results if r is not None]

    def baseline(self, task: Task, *, compile: bool = True) -> Baseline:
        """Eager and torch.compile times of the task's reference, interleaved in one measurement."""
        (found,) = self.baselines([task], compile=compile)
        if isinstance(found, ReferenceFailed):
            raise found
        return found

    def baselines(self, tasks: Sequence[Task], *, compile: bool = True,
                  on_result: Callable[[int, Baseline | ReferenceFailed], None] | None = None,
                  ) -> list[Baseline | ReferenceFailed]:
        """`baseline` of several tasks, their groups judged together as a batch's are: references
        load and torch.compile builds overlap, while timing still holds the device alone. Where a
        task's reference failed, its place holds the failure. `on_result(i, found)` hands over
        each task's answer as soon as its group closes (tasks already known first)."""
        self.ahead.before([], compiles=compile or self.config.compile_baseline)
        todo: dict[str, Task] = {}
        for task in tasks:
            known = self.cached_baseline(task)
            if known is None or (compile and known.compile_ms is None and not known.compile_error):
                todo.setdefault(self.context.tasks.key(task), task)
        groups = {key: Group(self.context, task, {}, lambda positions, res: None, baseline=True, compile=compile)
                  for key, task in todo.items()}
        keys = [self.context.tasks.key(task) for task in tasks]

        def answer(i: int) -> Baseline | ReferenceFailed:
            found = self.cached_baseline(tasks[i])
            if found is not None:
                return found
            group = groups.get(keys[i])
            why = group.failure if group is not None and group.failure else "the reference could not be timed"
            return ReferenceFailed(f"{tasks[i].name}: {why}" if tasks[i].name not in why else why)

        def closed(group: Group) -> None:
            if on_result is not None:
                for i, key in enumerate(keys):
                    if groups.get(key) is group:
                        on_result(i, answer(i))

        if on_result is not None:
            for i, key in enumerate(keys):
                if key not in groups:
                    on_result(i, answer(i))
        run_groups(list(groups.values()), device=self.config.device, width=self.config.concurrency,
                   on_closed=closed)
        return [answer(i) for i in range(len(tasks))]

    def cached_baseline(self, task: Task) -> Baseline | None:
        return self.context.baselines.get(self.context.tasks.key(task))

    def calibrate(self, task: Task, *, runs: int = 5,
                  on_run: Callable[[Calibration], None] | None = None) -> list[Calibration]:
        """A/A check (`kernelrl.judge.calibration`): identical code must measure 1.00. The band the
        runs span is stored for the task, and every later correct result of it carries it
        (`EvalResult.noise_band`): a speedup inside it cannot be told from noise."""
        measured = calibrate(self.context, task, runs=runs, on_run=on_run)
        self.context.tasks.put_band(task, self.fingerprint, noise_band(measured))
        return measured

    # -- what the judge knows of tasks and the machine ----------------------------------------

    def task_info(self, task: Task) -> TaskInfo:
        """Constants, profile and degeneracy of the task at the configured size (cached)."""
        info = self.context.tasks.get(task)
        if info is None:
            session = self._session(task)
            try:
                info = load_task_info(self.context, session, task)
            finally:
                self.context.references.release(task, session)
        return info

    def profile(self, task: Task) -> TaskProfile | None:
        return self.task_info(task).profile

    def reference_outputs(self, task: Task, plans: Sequence[InputPlan]) -> tuple[list[list[object]], list[object]]:
        """The task's inputs and its reference's outputs for the given input plans (for filters
        such as the degeneracy check); task code runs in a reference worker."""
        session = self._session(task)
        try:
            load_task_info(self.context, session, task)
            values, outputs, _ = session.make(list(plans), run=True)
            return values, outputs
        finally:
            self.context.references.release(task, session)

    def _session(self, task: Task) -> ReferenceSession:
        """A reference session of `task` outside a group, with the task's kept worker if there is one."""
        return session_for(task, self.config, pool=self.context.pool, rng=self.context.secrets.generator(),
                           kept=self.context.references.take(task))

    def peaks(self, *, remeasure: bool = False) -> MachinePeaks | None:
        """This machine's measured peaks (measured once, cached); None when they cannot be measured."""
        return self.context.peaks.get(remeasure=remeasure)

    # -- the result cache ---------------------------------------------------------------------

    def _key(self, task: Task, cand: Candidate) -> JudgedKey:
        return JudgedKey.of(task, cand.hash, self.fingerprint)


def evaluate(task: Task, candidate: Candidate | str, config: EvalConfig | None = None) -> EvalResult:
    """Judge one candidate with a short-lived evaluator (for one-off use; keep an `Evaluator` for many).

    A candidate its source alone refuses (it does not parse, has no `ModelNew`) is judged without
    starting workers first: reading it decides, and the reference never loads."""
    from kernelrl.judge.trial import static_verdict

    cand = candidate if isinstance(candidate, Candidate) else Candidate(source=candidate)
    cfg = config or EvalConfig()
    refused = static_verdict(cand.source, cand.language, device=cfg.device, static_findings=[])
    with Evaluator(cfg, warm_workers=0 if refused is not None else 3) as ev:  # the task, its timed copy, one candidate
        return ev.evaluate(task, cand)


def measure_baseline(task: Task, config: EvalConfig | None = None, *, compile: bool = True) -> Baseline:
    """A one-off baseline measurement (keep an `Evaluator` and call its `baseline` for many tasks)."""
    with Evaluator(config) as ev:
        return ev.baseline(task, compile=compile)
