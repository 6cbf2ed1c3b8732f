"""The search loop: parallel self-improving chains per task over the code database.

Each task gets `chains` chains. A chain's step builds a contrastive prompt around the chain's
current best (the first step starts from the reference), asks the proposer, stores the answer as
a candidate, evaluates it and stores the verdict; every `exchange_every` steps a chain adopts the
task's best of this run when that is better than its own. Chains of all tasks run at once: model
calls run on `model_concurrency` threads, and candidates waiting for a verdict are judged in
batches (`Evaluator.evaluate_batch`: candidates of one task are timed together with their
reference), one batch at a time, while model calls go on. A batch starts when no model call is
under way or when its oldest candidate has waited `batch_wait_s`. Only the calling thread
touches the database, so each write is one committed transaction from one writer.

Budgets: `budget` is candidates (model answers) per task in this run, split evenly over the
task's chains (budget 8 with 2 chains: 4 steps each; the remainder goes to the first chains), so
a run is `chains` x `budget / chains` steps per task; `token_budget` is prompt plus
completion tokens over the whole run (a resumed run counts what it spent before); `wall_time_s`
is per invocation. When a budget runs out no new model call starts and the calls and evaluations
already under way finish and are stored.

Guarantees:
- a source already evaluated for a task (same device, size and policy) is never evaluated again:
  the stored result is reused, and two chains proposing the same source at once share one
  evaluation;
- `resume=True` continues the database's latest run: candidates stored but not evaluated are
  evaluated without asking the model again, and chain state (step, current best) is rebuilt from
  the stored candidates (a chain's best at its last step is that step's parent);
- Ctrl-C stops new work and lets what is under way finish and be stored; a second Ctrl-C leaves
  at once (unfinished evaluations stay `proposed` and a resume evaluates them).
- nothing waits silently (`kernelrl.search.activity`); a verdict is stored when its group ends.

Task code never runs in the search's process: each task's profile (constants, shapes, what its
model is) comes from the evaluator's reference worker before the task's first prompt; a task
whose reference hangs, crashes or fails is given up with its reason and the others go on.

Baselines (eager and torch.compile times) are measured once per task, device and size, inside
the task's first timing group (`EvalConfig.compile_baseline`), and stored. With an injected
`measure_baseline`, they are measured first instead, and a task's first prompt waits for them.

Does not guarantee: that an evaluation running when the process was SIGKILLed is not run again on
resume (its result never reached the database); fairness between tasks beyond round-robin order.
"""

from __future__ import annotations

import dataclasses
import functools
import queue
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import Progress

from kernelrl.candidate import Candidate, extract_code, source_hash
from kernelrl.judge.device import DevicePeaks
from kernelrl.judge.evaluator import Evaluator, config_fingerprint
from kernelrl.judge.roofline import prompt_peaks
from kernelrl.result import EvalResult, Status
from kernelrl.search.activity import LockWatch, SearchActivity, lock_watch, waiting
from kernelrl.search.chains import Chain, TaskState, better, fmt_speedup, rebuild
from kernelrl.search.config import SearchConfig
from kernelrl.search.database import Database
from kernelrl.search.proposers import (
    Exhausted,
    ProposalRequest,
    Proposer,
    ProposerUnavailable,
    make_proposer,
)
from kernelrl.search.records import CandidateRecord, CandidateState, NewCandidate, RunStatus
from kernelrl.search.summary import SearchSummary, StopReason, TaskSummary
from kernelrl.tasks.suites import load_tasks
from kernelrl.tasks.task import Task

# A task whose proposer fails this many times in a row is given up for this run: the error is
# then not transient (bad model name, bad key), and retrying only burns the wall clock.
MAX_PROPOSER_FAILURES = 3
_POLL_S = 0.2


# Injectable collaborators, so the loop can run against fakes and any proposer.
EvaluateFn = Callable[[Task, Candidate], EvalResult]
BatchFn = Callable[[list[tuple[Task, Candidate]]], list[EvalResult]]
BaselineFn = Callable[[Task], Any]  # returns an object with eager_ms and compile_ms (kernelrl.judge.baseline.Baseline)
ProfileFn = Callable[[Task], Any]  # returns a kernelrl.judge.profile.TaskProfile (or None)
PromptFn = Callable[..., str]


class _Search:
    def __init__(self, config: SearchConfig, *, console: Console, tasks: list[Task], db: Database, proposer: Proposer,
                 evaluate_batch: BatchFn, build_prompt: PromptFn, measure_baseline: BaselineFn | None,
                 fingerprint: str, profile: ProfileFn | None = None, known_baseline: BaselineFn | None = None,
                 device: DevicePeaks | None = None) -> None:
        self.config = config
        # the evaluator config results are judged under: stored results are reused only under it
        self.fingerprint = fingerprint
        self.console = console
        self.db = db
        self.proposer = proposer
        self.evaluate_batch = evaluate_batch
        self.build_prompt = build_prompt
        self.measure_baseline = measure_baseline
        self.profile = profile
        self.device = device  # what prompts say of the device (kernelrl.judge.device.DevicePeaks), when known
        self.known_baseline = known_baseline  # baselines the evaluator measured inside its groups
        self.profiles: dict[str, Any] = {}
        self.eval_pending: list[tuple[str, str]] = []  # keys waiting for a batch, oldest first
        self.pending_since: float | None = None
        self.batch_running = False
        self.events: queue.Queue[tuple[str, Any, Any]] = queue.Queue()
        self.model_slots = threading.Semaphore(config.model_concurrency)
        self.eval_slots = threading.Semaphore(1)  # batches and injected baseline measurements, one at a time
        self.profile_slots = threading.Semaphore(2)
        self.state: dict[str, TaskState] = {}
        self.task_order = [t.name for t in tasks]
        self.tasks = {t.name: t for t in tasks}
        self.evals_in_flight: dict[tuple[str, str], list[CandidateRecord]] = {}  # (task, hash) -> waiting records
        self.baselines_in_flight = 0
        self.evaluations = 0
        self.reused = 0
        self.errors: list[str] = []
        self.stop_reason: StopReason | None = None
        self.abandon = False
        self.started = time.monotonic()
        self.run_id = 0
        self.resumed = False
        self.prompt_tokens = 0
        self.completion_tokens = 0

    # ------------------------------------------------------------ setup
    def open_run(self) -> None:
        cfg = self.config
        latest = self.db.latest_run() if cfg.resume else None
        for t in self.tasks.values():
            self.db.upsert_task(name=t.name, source=t.source, source_hash=t.source_hash, level=t.level, size=cfg.eval.size)
        # the task names are stored with the run so a report counts a task that got no candidate
        stored = {**cfg.to_json(), "task_names": list(self.task_order)}
        if latest is not None:
            self.run_id, self.resumed = latest.id, True
            self.db.reopen_run(latest.id, stored)
        else:
            self.run_id = self.db.start_run(stored)
        self.prompt_tokens, self.completion_tokens = self.db.token_totals(self.run_id)
        for name in self.task_order:
            ts = TaskState(task=self.tasks[name], chains=[Chain(task=name, index=i) for i in range(cfg.chains)])
            self.state[name] = ts
            if self.resumed:
                rebuild(ts, self.db, self.run_id, episodes=cfg.episode_config(), template_dir=cfg.template_dir)

    def _spawn(self, kind: str, slots: threading.Semaphore, fn: Callable[[], Any], payload: Any) -> None:
        def body() -> None:
            with slots:
                try:
                    out: Any = fn()
                except BaseException as e:  # noqa: BLE001 - reported to the loop, which decides
                    out = e
            self.events.put((kind, payload, out))

        # Daemon threads: a second Ctrl-C may leave while a call is still under way.
        threading.Thread(target=body, name=f"kernelrl-{kind}", daemon=True).start()

    # ------------------------------------------------------------ scheduling
    def _budget_stop(self) -> StopReason | None:
        cfg = self.config
        if cfg.wall_time_s is not None and time.monotonic() - self.started >= cfg.wall_time_s:
            return StopReason.WALL_TIME
        if cfg.token_budget is not None and self.prompt_tokens + self.completion_tokens >= cfg.token_budget:
            return StopReason.TOKENS
        return None

    def start_batch(self) -> None:
        """Judge every waiting candidate in one batch, when the moment is right (module docstring)."""
        if self.batch_running or not self.eval_pending:
            return
        proposing = any(ts.in_flight for ts in self.state.values())
        waited = time.monotonic() - (self.pending_since or time.monotonic())
        if proposing and waited < self.config.batch_wait_s and self.stop_reason is None:
            return
        keys, self.eval_pending, self.pending_since = self.eval_pending, [], None
        items = []
        for key in keys:
            rec = self.evals_in_flight[key][0]
            items.append((self.tasks[rec.task], Candidate(source=rec.source, origin=f"candidate {rec.id}")))
        self.batch_running = True  # results stream in as each task's group ends, where the evaluator can:
        stream = {"on_result": lambda i, r: self.events.put(("result", keys[i], r))} if self.streams else {}
        self._spawn("evaluation", self.eval_slots, lambda: self.evaluate_batch(items, **stream), keys)

    def schedule(self) -> None:
        self.start_batch()
        if self.stop_reason is not None:
            return
        reason = self._budget_stop()
        if reason is not None:
            self.stop_reason = reason
            return
        # Round-robin over tasks, one chain step each per pass, so no task starves the others of
        # model slots.
        progressed = True
        while progressed:
            progressed = False
            for name in self.task_order:
                ts = self.state[name]
                if (ts.gave_up or ts.baseline_pending or ts.profile_pending
                        or ts.proposed + ts.in_flight >= self.config.budget):
                    continue
                chain = next((c for c in ts.chains if c.active and not c.busy and c.step < self._quota(c.index)),
                             None)
                if chain is None:
                    continue
                self._start_step(ts, chain)
                progressed = True

    def _quota(self, index: int) -> int:
        """Steps chain `index` may take: the task's budget split evenly, the first chains taking the rest."""
        per, extra = divmod(self.config.budget, self.config.chains)
        return per + (1 if index < extra else 0)

    def _start_step(self, ts: TaskState, chain: Chain) -> None:
        cfg = self.config
        rng = random.Random(f"{cfg.seed}:{ts.task.name}:{chain.index}:{chain.step}")
        extra = {"template_dir": cfg.template_dir} if cfg.template_dir is not None else {}
        profile = self.profiles.get(ts.task.name)
        if profile is not None:
            extra["profile"] = profile
        prompt = self.build_prompt(ts.task, db=self.db, chain_best=chain.best, policy=cfg.eval.policy,
                                   device=self.device or cfg.eval.device, rng=rng, k=cfg.k_shown, size=cfg.eval.size,
                                   **extra)
        parent = chain.best
        if cfg.turns > 1:
            prompt, parent = chain.next_turn(prompt, cfg.episode_config(), cfg.template_dir)
        request = ProposalRequest(task=ts.task, prompt=prompt, parent=parent.source if parent else None,
                                  chain=chain.index, step=chain.step, profile=profile)
        chain.busy = True
        ts.in_flight += 1
        self._spawn("proposal", self.model_slots, lambda: self.proposer.propose(request),
                    (ts.task.name, chain.index, chain.step, prompt, parent))
        chain.step += 1

    def start_profiles(self) -> None:
        if self.profile is None:
            return
        for name in self.task_order:
            self.state[name].profile_pending = True
            self._spawn("profile", self.profile_slots, functools.partial(self.profile, self.tasks[name]), name)

    def on_profile(self, name: str, out: Any) -> None:
        ts = self.state[name]
        ts.profile_pending = False
        if isinstance(out, BaseException):
            ts.gave_up = f"task error: {out}"
            msg = f"{name}: the task's reference fails: {str(out).splitlines()[0] if str(out) else type(out).__name__}"
            self.errors.append(msg)
            self.console.print(f"[red]{msg}[/red]")
            return
        self.profiles[name] = out

    def start_baselines(self) -> None:
        if self.measure_baseline is None:
            return
        for name in self.task_order:
            if self.db.get_baseline(name, self.config.eval.device, self.config.eval.size) is None:
                task = self.tasks[name]
                self.state[name].baseline_pending = True
                self.baselines_in_flight += 1
                self._spawn("baseline", self.eval_slots, functools.partial(self.measure_baseline, task), name)

    # ------------------------------------------------------------ events
    def on_proposal(self, payload: tuple[str, int, int, str, CandidateRecord | None], out: Any) -> None:
        name, index, step, prompt, parent = payload
        ts = self.state[name]
        chain = ts.chains[index]
        ts.in_flight -= 1
        if isinstance(out, Exhausted):
            # a finite proposer has nothing more for this task: its chains end, quietly
            chain.busy = False
            chain.step -= 1
            for c in ts.chains:
                c.active = False
            ts.gave_up = ts.gave_up or f"proposer exhausted: {out}"
            return
        if isinstance(out, BaseException):
            chain.busy = False
            chain.step -= 1  # the step did not happen
            ts.failures += 1
            msg = f"{name}: proposer failed: {type(out).__name__}: {out}"
            self.errors.append(msg)
            self.console.print(f"[yellow]{msg}[/yellow]")
            if ts.failures >= MAX_PROPOSER_FAILURES or isinstance(out, ProposerUnavailable):
                ts.gave_up = f"proposer failed {ts.failures} times in a row"
            return
        ts.failures = 0
        code = out.code if out.code is not None else extract_code(out.answer)
        source = code or ""
        self.prompt_tokens += int(out.prompt_tokens)
        self.completion_tokens += int(out.completion_tokens)
        rec = self.db.add_candidate(NewCandidate(
            task=name, hash=source_hash(source), source=source, parents=(parent.id,) if parent else (),
            chain=index, step=step, proposer=self.config.proposer, prompt=prompt, answer=out.answer,
            prompt_tokens=int(out.prompt_tokens), completion_tokens=int(out.completion_tokens), run_id=self.run_id,
            meta={**dict(getattr(out, "meta", None) or {}), **chain.turn_meta()}))
        ts.proposed += 1
        self.dispatch_evaluation(rec)

    def dispatch_evaluation(self, rec: CandidateRecord) -> None:
        cfg = self.config
        if not rec.source.strip():
            result = EvalResult(task=rec.task, status=Status.COMPILE_ERROR,
                                message="the answer holds no complete code block", device=cfg.eval.device,
                                size=cfg.eval.size, policy=cfg.eval.policy, candidate_hash=rec.hash)
            self.db.store_result(rec.id, result)
            self._on_result(rec, result)
            return
        hit = self.db.find_result(rec.task, rec.hash, fingerprint=self.fingerprint)
        if hit is not None:
            self.db.store_reused_result(rec.id, hit[0], hit[1])
            self.reused += 1
            self._on_result(rec, hit[1])
            return
        key = (rec.task, rec.hash)
        if key in self.evals_in_flight:  # the same source is being evaluated for another chain
            self.evals_in_flight[key].append(rec)
            return
        self.evals_in_flight[key] = [rec]
        self.eval_pending.append(key)
        if self.pending_since is None:
            self.pending_since = time.monotonic()

    def on_batch(self, keys: list[tuple[str, str]], out: Any) -> None:
        self.batch_running = False
        if isinstance(out, BaseException) or len(out) != len(keys):
            err = out if isinstance(out, BaseException) else RuntimeError(f"{len(out)} results for {len(keys)}")
            for key in (k for k in keys if k in self.evals_in_flight):  # not streamed already
                self.on_evaluation(key, err)
            return
        for key, result in ((k, r) for k, r in zip(keys, out) if k in self.evals_in_flight):
            self.on_evaluation(key, result)
        self._store_known_baselines({k[0] for k in keys})

    def _store_known_baselines(self, names: set[str]) -> None:
        if self.known_baseline is None:
            return
        cfg = self.config
        for name in names:
            if self.db.get_baseline(name, cfg.eval.device, cfg.eval.size) is not None:
                continue
            b = self.known_baseline(self.tasks[name])
            if b is not None:
                self.db.put_baseline(task=name, device=cfg.eval.device, size=cfg.eval.size,
                                     eager_ms=float(b.eager_ms), compile_ms=b.compile_ms,
                                     compile_ci=b.compile_speedup_ci)

    def on_evaluation(self, key: tuple[str, str], out: Any) -> None:
        waiting = self.evals_in_flight.pop(key)
        first, rest = waiting[0], waiting[1:]
        if isinstance(out, BaseException):
            # The evaluator itself broke (not the candidate): store nothing, so a resume retries.
            msg = f"{key[0]}: evaluation of candidate {first.id} failed: {type(out).__name__}: {out}"
            self.errors.append(msg)
            self.console.print(f"[red]{msg}[/red]")
            for rec in waiting:
                self.state[rec.task].chains[rec.chain].busy = False
            return
        if out.status is Status.TASK_ERROR:
            # The task, not the candidate, failed: nothing to store, and the task stops here.
            ts = self.state[key[0]]
            ts.gave_up = ts.gave_up or f"task error: {out.message}"
            msg = f"{key[0]}: the task's reference fails: {out.message}"
            self.errors.append(msg)
            self.console.print(f"[red]{msg}[/red]")
            for rec in waiting:
                self.state[rec.task].chains[rec.chain].busy = False
            return
        self.evaluations += 1
        if not out.config_fingerprint:
            # An injected judge is taken to judge under the run's evaluator config.
            out = dataclasses.replace(out, config_fingerprint=self.fingerprint)
        self.db.store_result(first.id, out)
        self._on_result(first, out)
        for rec in rest:
            self.db.store_reused_result(rec.id, first.id, out)
            self.reused += 1
            self._on_result(rec, out)

    def on_baseline(self, name: str, out: Any) -> None:
        self.baselines_in_flight -= 1
        self.state[name].baseline_pending = False
        if isinstance(out, BaseException):
            msg = f"{name}: baseline measurement failed: {type(out).__name__}: {out}"
            self.errors.append(msg)
            self.console.print(f"[yellow]{msg}[/yellow]")
            return
        self.db.put_baseline(task=name, device=self.config.eval.device, size=self.config.eval.size,
                             eager_ms=float(out.eager_ms), compile_ms=out.compile_ms,
                             compile_ci=getattr(out, "compile_speedup_ci", None))

    def _on_result(self, rec: CandidateRecord, result: EvalResult) -> None:
        rec = dataclasses.replace(rec, result=result, state=CandidateState.EVALUATED)
        ts = self.state[rec.task]
        chain = ts.chains[rec.chain]
        ts.evaluated += 1
        ts.correct += rec.is_correct
        if chain.episode is not None and rec.meta.get("turn") == chain.episode.turn:
            chain.record_turn(rec, result, self.db.get_baseline(rec.task, self.config.eval.device, self.config.eval.size))
        if better(rec, chain.best):
            chain.best = rec
        if better(rec, ts.best):
            ts.best = rec
        every = self.config.exchange_every
        if every and chain.step % every == 0 and better(ts.best, chain.best):
            chain.best = ts.best  # exchange: adopt the task's best of this run
        chain.busy = False
        self._update_progress(ts)

    def _update_progress(self, ts: TaskState) -> None:
        if self.progress is not None and ts.progress_id is not None:
            self.progress.update(ts.progress_id, completed=ts.evaluated, best=fmt_speedup(ts.best))

    progress: Progress | None = None
    watch: LockWatch | None = None  # the timing lock, whose holder the status line names; streams: the judge
    streams = False  # hands each result over as soon as it is final (`on_result`)

    def busy(self) -> bool:
        return (any(ts.in_flight or ts.profile_pending for ts in self.state.values()) or bool(self.evals_in_flight)
                or self.baselines_in_flight > 0 or self.batch_running)

    # ------------------------------------------------------------ main loop
    def run(self) -> None:
        interrupts = [0]

        def on_sigint(signum: int, frame: Any) -> None:
            interrupts[0] += 1

        old_handler = None
        if threading.current_thread() is threading.main_thread():
            # A flag, not an exception: a Ctrl-C must never land in the middle of a write.
            old_handler = signal.signal(signal.SIGINT, on_sigint)
        self.activity = SearchActivity(self.console, self.watch)
        self.progress = self.activity.progress
        seen_interrupts = 0
        try:
            with self.progress:
                for name in self.task_order:
                    ts = self.state[name]
                    ts.progress_id = self.progress.add_task(name, total=self.config.budget, completed=ts.evaluated,
                                                            best=fmt_speedup(ts.best))
                # Proposed but never evaluated (a killed run): evaluate, do not ask again.
                for rec in self.db.pending_candidates(self.run_id):
                    if rec.task not in self.state:
                        continue  # a task this invocation does not run: it stays pending for a later resume
                    self.state[rec.task].chains[rec.chain].busy = True
                    self.dispatch_evaluation(rec)
                self.start_profiles()
                self.start_baselines()
                self.schedule()
                while self.busy():
                    self.activity.tick(self)
                    if interrupts[0] != seen_interrupts:
                        seen_interrupts = interrupts[0]
                        if seen_interrupts == 1:
                            self.stop_reason = StopReason.INTERRUPTED
                            self.console.print("[yellow]stopping: finishing the calls and evaluations under way "
                                               "(Ctrl-C again to leave now; a resume evaluates what is left)"
                                               "[/yellow]")
                        else:
                            self.abandon = True
                            break
                    try:
                        kind, payload, out = self.events.get(timeout=_POLL_S)
                    except queue.Empty:
                        self.schedule()
                        continue
                    if kind == "proposal":
                        self.on_proposal(payload, out)
                    elif kind == "evaluation":
                        self.on_batch(payload, out)
                    elif kind == "result":  # one result of a batch still running
                        self.on_evaluation(payload, out)
                    elif kind == "profile":
                        self.on_profile(payload, out)
                    else:
                        self.on_baseline(payload, out)
                    self.schedule()
        finally:
            if old_handler is not None:
                signal.signal(signal.SIGINT, old_handler)
        if self.stop_reason is None:
            self.stop_reason = StopReason.BUDGET

    def summary(self) -> SearchSummary:
        tasks = []
        for name in self.task_order:
            ts = self.state[name]
            tasks.append(TaskSummary(task=name, candidates=ts.proposed, evaluated=ts.evaluated, correct=ts.correct,
                                     best_speedup=ts.best.speedup if ts.best else None,
                                     best_candidate=ts.best.id if ts.best else None, gave_up=ts.gave_up))
        return SearchSummary(run_id=self.run_id, resumed=self.resumed, stop_reason=self.stop_reason or StopReason.BUDGET,
                             tasks=tuple(tasks), prompt_tokens=self.prompt_tokens,
                             completion_tokens=self.completion_tokens, evaluations=self.evaluations,
                             reused=self.reused, elapsed_s=time.monotonic() - self.started, errors=tuple(self.errors))


def run_search(config: SearchConfig, *, console: Console | None = None, tasks: list[Task] | None = None,
               proposer: Proposer | None = None, evaluate: EvaluateFn | None = None,
               evaluate_batch: BatchFn | None = None, build_prompt: PromptFn | None = None,
               measure_baseline: BaselineFn | None = None, evaluator: Evaluator | None = None) -> SearchSummary:
    """Run (or with `config.resume`, continue) a search; return what it did.

    `tasks` overrides loading `config.tasks`; `proposer` (an object with `propose(request)`) and
    `build_prompt(...)` replace the defaults from kernelrl.search.proposers and
    kernelrl.search.prompt. Candidates are judged by `evaluator` (a
    `kernelrl.judge.evaluator.Evaluator`; one is made from `config.eval` when None), or by an
    injected `evaluate_batch(items)` or `evaluate(task, candidate)`; with an injected one, task
    profiles and baselines come only from `measure_baseline(task)` when it is given.
    """
    console = console or Console()
    if tasks is None:
        tasks = load_tasks(list(config.tasks))
    if not tasks:
        raise ValueError(f"no tasks found for {', '.join(config.tasks)}")
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate task names: {sorted({n for n in names if names.count(n) > 1})}")
    if build_prompt is None:
        from kernelrl.search.prompt import build_prompt as default_build_prompt

        build_prompt = default_build_prompt
    owned_evaluator = False
    profile = known_baseline = None
    device: DevicePeaks | None = None
    fingerprint = config_fingerprint(config.eval)
    if evaluate_batch is None and evaluate is not None:
        single = evaluate
        evaluate_batch = lambda items: [single(task, cand) for task, cand in items]  # noqa: E731
    if evaluate_batch is None:
        if evaluator is None:
            with waiting(console, "starting the evaluator"):
                evaluator = Evaluator(dataclasses.replace(config.eval, compile_baseline=config.baselines
                                                          and measure_baseline is None))
            owned_evaluator = True
        evaluate_batch = evaluator.evaluate_batch
        fingerprint = evaluator.fingerprint
        profile = evaluator.profile
        known_baseline = evaluator.cached_baseline
        with waiting(console, "this machine's peak bandwidth and FLOP/s (measured once, then cached)",
                     lock_watch(evaluator)):
            peaks = evaluator.peaks()  # prompts state them
        if peaks is not None:
            device = prompt_peaks(peaks, config.eval.device)
    if not config.baselines:
        measure_baseline = None
    owned = proposer is None
    try:
        if proposer is None:
            opts = dict(config.proposer_opts)
            if config.proposer.startswith("openai:"):
                # the model's requests in flight: one per proposer call the loop makes at once
                opts.setdefault("concurrency", config.model_concurrency)
            proposer = make_proposer(config.proposer, policy=config.eval.policy, device=config.eval.device, **opts)
        with Database(config.db_path) as db:
            search = _Search(config, console=console, tasks=tasks, db=db, proposer=proposer,
                             evaluate_batch=evaluate_batch, build_prompt=build_prompt,
                             measure_baseline=measure_baseline, profile=profile, known_baseline=known_baseline,
                             device=device, fingerprint=fingerprint)
            search.watch = lock_watch(evaluator) if evaluator is not None else None
            search.streams = evaluator is not None and evaluate_batch == evaluator.evaluate_batch
            search.open_run()
            status = RunStatus.FAILED
            try:
                search.run()
                status = RunStatus.INTERRUPTED if search.stop_reason is StopReason.INTERRUPTED else RunStatus.FINISHED
            finally:
                db.finish_run(search.run_id, status)
            return search.summary()
    finally:
        if owned and proposer is not None:
            proposer.close()
        if owned_evaluator and evaluator is not None:
            evaluator.close()
