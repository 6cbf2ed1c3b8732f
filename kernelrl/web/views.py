"""What the run page and the task page show, computed from one snapshot of the database.

`run_view(snap, run_id, now=...)` and `task_view(snap, run_id, task)`, over one `Snapshot` of the
file (`kernelrl.store.snapshot`, which holds every query), return typed views; pages
render them (`kernelrl.web.pages`) and the JSON endpoints return them as they are.

Definitions follow `kernelrl.report.report` (a task's best is its fastest correct candidate of
this run; against torch.compile = speedup x compile_ms / eager_ms of the stored baseline on the
same device and size; fast_p over all the run's tasks, counting tasks with no candidate, and a
best within noise never counting as faster: `kernelrl.report.metrics.counts_as_faster`). Added:
- the interval: the best candidate's 95 % speedup interval, as the evaluator stored it;
- progress: a search's evaluated candidates out of budget x tasks; a GRPO run's steps out of
  `max_steps`; ETA = what is left / the rate of the last `RATE_WINDOW` units (over the time
  since the unit before them, or since the run started), only while the run is marked running
  (a killed run stays "running": `idle_s` says how long nothing happened);
- speedup over time: each task's best-so-far at every evaluation time of the run;
- training (GRPO runs): per step, from the stored rollouts: mean raw reward, mean clipped reward
  of the rollouts given to the trainer (kept by RoC), the share correct and the share correct
  and faster than eager (fast_1); per logging step, from the step log (`Snapshot.train_steps`): TRL's
  metrics and the curriculum's per-task weights.

Does not re-measure or re-judge anything.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

from kernelrl.judge.timing.throughput import Throughput
from kernelrl.report.metrics import counts_as_faster, fast_p, geometric_mean
from kernelrl.report.report import FAST_P
from kernelrl.reward import within_noise
from kernelrl.store.records import RunRecord, RunStage, RunStatus
from kernelrl.store.snapshot import CandidateDetail, CandidateRow, HackRow, Snapshot, TaskRow
from kernelrl.store.steps import StepRecord

RATE_WINDOW = 20  # units (candidates or steps) the ETA's rate is measured over
RECENT_REFUSED = 20  # refused candidates listed on a run page
JUDGE_WINDOW = 256  # the latest verdicts the judge's throughput on a run page is measured over
SEARCH = "search"


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    id: int
    kind: str  # "search", "bench", or the training stage: "collect", "sft", "rft", "grpo"
    status: str
    started: float  # seconds since the epoch
    finished: float | None
    proposer: str
    candidates: int


@dataclass(frozen=True, kw_only=True)
class Progress:
    unit: str  # "candidates" or "steps"
    done: int
    total: int | None  # None: the run does not say
    rate_per_s: float | None  # units per second over the last RATE_WINDOW
    eta_s: float | None  # None: not running, nothing done yet, or no total
    elapsed_s: float
    idle_s: float | None  # since the last unit finished


@dataclass(frozen=True, kw_only=True)
class TaskLine:
    task: str
    level: int | None
    candidates: int
    evaluated: int
    correct: int
    refused: int
    best_candidate: int | None
    speedup_vs_eager: float | None
    interval: tuple[float, float] | None  # 95 % interval of the best candidate's speedup
    speedup_vs_compile: float | None
    eager_ms: float | None
    compile_ms: float | None
    roofline_pct: float | None
    within_noise: bool = False  # the best speedup cannot be told from 1.0x (`kernelrl.reward.within_noise`)
    compile_within_noise: bool = False  # the task's eager / torch.compile ratio cannot be told from 1.0


@dataclass(frozen=True, kw_only=True)
class Curve:
    """Best-so-far speedup of each task at every evaluation of the run (None: nothing correct yet)."""

    times: list[float] = field(default_factory=list)  # seconds since the epoch
    best: dict[str, list[float | None]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class StepLine:
    """One GRPO step, from its stored rollouts."""

    step: int
    rollouts: int
    raw_reward: float | None
    clipped_reward: float | None
    clipped: int  # rollouts whose reward the clip changed
    correct_share: float
    fast_1_share: float


@dataclass(frozen=True, kw_only=True)
class Training:
    steps: list[StepLine]
    logged: list[StepRecord]


@dataclass(frozen=True, kw_only=True)
class RunView:
    run: RunSummary
    progress: Progress
    tasks: list[TaskLine]
    fast_p: list[tuple[float, float]]
    solved: int
    geomean_vs_eager: float | None
    median_vs_eager: float | None
    geomean_vs_compile: float | None
    median_vs_compile: float | None
    status_counts: dict[str, int]
    refused_by_rule: list[tuple[str, int]]
    recent_refused: list[HackRow]
    curve: Curve
    training: Training | None
    now: float
    judge: Throughput | None = None  # the run's latest verdicts per hour, and where their groups' time went


@dataclass(frozen=True, kw_only=True)
class TaskView:
    run: RunSummary
    task: str
    level: int | None
    reference: str  # the task's source
    line: TaskLine
    candidates: list[CandidateDetail]  # creation order
    parents: dict[int, str]  # parent id -> source, for the diffs
    hack_cases: list[HackRow]


class NotFound(LookupError):
    """No such run, task or candidate in the database."""


def run_kind(run: RunRecord) -> str:
    stage = run.config.get("stage")
    return str(stage) if isinstance(stage, str) and stage else SEARCH


def summary(run: RunRecord, candidates: int) -> RunSummary:
    proposer = run.config.get("proposer")
    if not isinstance(proposer, str):
        proposer = run_kind(run)
    return RunSummary(id=run.id, kind=run_kind(run), status=run.status.value, started=run.started,
                      finished=run.finished, proposer=proposer, candidates=candidates)


def run_list(snap: Snapshot) -> list[RunSummary]:
    return [summary(r, n) for r, n in snap.runs()]


def _get_run(snap: Snapshot, run_id: int) -> RunRecord:
    run = snap.run(run_id)
    if run is None:
        raise NotFound(f"no run {run_id} in this database")
    return run


def run_view(snap: Snapshot, run_id: int, *, now: float) -> RunView:
    run = _get_run(snap, run_id)
    cands = snap.candidates(run_id)
    known = snap.tasks()
    names = list(run.config.get("task_names") or [])
    if not names and run_kind(run) != SEARCH:
        names = [str(t) for t in (run.config.get("config") or {}).get("tasks") or [] if str(t) in known]
    names = sorted(set(names) | {c.task for c in cands})
    lines = _task_lines(snap, run_id, names, cands, known)
    eager = [t.speedup_vs_eager for t in lines if t.speedup_vs_eager is not None]
    comp = [t.speedup_vs_compile for t in lines if t.speedup_vs_compile is not None]
    refused = snap.refused_rules(run_id)
    by_rule = Counter(rule for rules in refused.values() for rule in rules)
    statuses = Counter(c.status or unjudged_label(run.status) for c in cands)
    training = _training(snap, run_id, cands) if run_kind(run) == "grpo" else None
    return RunView(
        run=summary(run, len(cands)), progress=_progress(run, cands, training, len(names), now), tasks=lines,
        fast_p=[(p, fast_p([t.speedup_vs_eager for t in lines], p, within_noise=[t.within_noise for t in lines]))
                for p in FAST_P], solved=len(eager),
        geomean_vs_eager=geometric_mean(eager), median_vs_eager=statistics.median(eager) if eager else None,
        geomean_vs_compile=geometric_mean(comp), median_vs_compile=statistics.median(comp) if comp else None,
        status_counts=dict(statuses.most_common()),
        refused_by_rule=sorted(by_rule.items(), key=lambda kv: (-kv[1], kv[0])),
        recent_refused=snap.hack_cases(run_id, limit=RECENT_REFUSED), curve=_curve(names, cands),
        training=training, now=now, judge=_judge(snap, run))


def _judge(snap: Snapshot, run: RunRecord) -> Throughput | None:
    """The judge's throughput over the run's latest JUDGE_WINDOW verdicts: their count over the
    time since the verdict before them (or the run's start), their groups' phases summed."""
    rows = snap.judged_results(run.id, JUDGE_WINDOW + 1)
    if not rows:
        return None
    since = rows[0][0] if len(rows) > JUDGE_WINDOW else run.started
    window = rows[1:] if len(rows) > JUDGE_WINDOW else rows
    return Throughput.of([r for _, r in window], max(0.0, window[-1][0] - since))


def unjudged_label(run_status: str) -> str:
    """What a candidate without a verdict is called: being judged while its run runs; after it, not
    judged (the run ended first: `--resume` judges it)."""
    return "pending" if run_status == "running" else "not judged"


def _task_lines(snap: Snapshot, run_id: int, names: list[str], cands: list[CandidateRow],
                known: dict[str, TaskRow]) -> list[TaskLine]:
    by_task: dict[str, list[CandidateRow]] = {n: [] for n in names}
    for c in cands:
        by_task.setdefault(c.task, []).append(c)
    best = {n: max((c for c in own if c.status == "correct" and c.speedup is not None),
                   key=lambda c: (c.speedup, -c.id), default=None) for n, own in by_task.items()}
    full = snap.results([b.id for b in best.values() if b is not None])
    bases = snap.baselines()
    lines = []
    for name in names:
        own = by_task[name]
        b = best[name]
        res = full.get(b.id) if b is not None else None
        base = bases.get((name, b.device or "", b.size or "")) if b is not None else None
        vs_compile = None
        if b is not None and b.speedup is not None and base is not None and base.compile_ms:
            vs_compile = b.speedup * base.compile_ms / base.eager_ms
        task = known.get(name)
        lines.append(TaskLine(
            task=name, level=task.level if task else None, candidates=len(own),
            evaluated=sum(1 for c in own if c.status is not None),
            correct=sum(1 for c in own if c.status == "correct"),
            refused=sum(1 for c in own if c.status == "flagged"),
            best_candidate=b.id if b else None, speedup_vs_eager=b.speedup if b else None,
            interval=res.speedup_ci if res is not None else None, speedup_vs_compile=vs_compile,
            eager_ms=base.eager_ms if base else None, compile_ms=base.compile_ms if base else None,
            roofline_pct=res.roofline_pct if res is not None else None,
            within_noise=res is not None and within_noise(res),
            compile_within_noise=base is not None and base.compile_within_noise))
    return lines


def _curve(names: list[str], cands: list[CandidateRow]) -> Curve:
    done = sorted((c for c in cands if c.evaluated is not None), key=lambda c: (c.evaluated, c.id))
    running: dict[str, float | None] = {n: None for n in names}
    times: list[float] = []
    best: dict[str, list[float | None]] = {n: [] for n in names}
    for c in done:
        if c.status == "correct" and c.speedup is not None:
            prev = running.get(c.task)
            running[c.task] = c.speedup if prev is None else max(prev, c.speedup)
        times.append(float(c.evaluated or 0.0))
        for n in names:
            best[n].append(running.get(n))
    return Curve(times=times, best=best)


def _progress(run: RunRecord, cands: list[CandidateRow], training: Training | None, n_tasks: int,
              now: float) -> Progress:
    end = run.finished if run.finished is not None else now
    elapsed = max(0.0, end - run.started)
    if training is not None:
        trl = ((run.config.get("config") or {}).get("grpo") or {}).get("trl") or {}
        total = trl.get("max_steps") if isinstance(trl.get("max_steps"), int) else None
        # Steps reached: rollouts stored at TRL's global step k mean k steps were done before them
        # and step k + 1 is under way; a logged step k (the step log) means k steps are done.
        stamps: dict[int, float] = {}
        for c in cands:
            step = c.meta.step
            if step is not None and c.evaluated is not None:
                stamps[step + 1] = max(stamps.get(step + 1, 0.0), c.evaluated)
        for rec in training.logged:
            stamps[rec.step] = max(stamps.get(rec.step, 0.0), rec.logged)
        done = max(stamps, default=0)
        unit, done, times = "steps", min(done, total) if total is not None else done, sorted(stamps.values())
    else:
        budget = run.config.get("budget")
        total = budget * n_tasks if run_kind(run) == SEARCH and isinstance(budget, int) else None
        times = sorted(c.evaluated for c in cands if c.evaluated is not None)
        unit, done = "candidates", len(times)
    # Units finish in batches (a batch of candidates is stored at once): the rate is the last
    # RATE_WINDOW units over the time since the unit before them, or since the run started.
    rate = None
    if times:
        n = min(len(times), RATE_WINDOW)
        since = times[-n - 1] if len(times) > n else run.started
        if times[-1] > since:
            rate = n / (times[-1] - since)
    eta = None
    running = run.status is RunStatus.RUNNING
    if running and total is not None and rate and done < total:
        eta = (total - done) / rate
    elif running and total is not None and done >= total:
        eta = 0.0
    idle = max(0.0, now - times[-1]) if times and running else None
    return Progress(unit=unit, done=done, total=total, rate_per_s=rate, eta_s=eta, elapsed_s=elapsed, idle_s=idle)


def _training(snap: Snapshot, run_id: int, cands: list[CandidateRow]) -> Training:
    by_step: dict[int, list[CandidateRow]] = {}
    for c in cands:
        step = c.meta.step
        if c.meta.stage is RunStage.GRPO and step is not None:
            by_step.setdefault(step, []).append(c)
    lines = []
    for step in sorted(by_step):
        own = by_step[step]
        raws = [c.meta.raw for c in own if c.meta.raw is not None and math.isfinite(c.meta.raw)]
        given = [c.meta.reward for c in own
                 if c.meta.kept and c.meta.reward is not None and math.isfinite(c.meta.reward)]
        correct = [c for c in own if c.status == "correct"]
        full = snap.results([c.id for c in correct if c.speedup is not None])
        lines.append(StepLine(step=step, rollouts=len(own), raw_reward=statistics.fmean(raws) if raws else None,
                              clipped_reward=statistics.fmean(given) if given else None,
                              clipped=sum(1 for c in own if c.meta.clipped),
                              correct_share=len(correct) / len(own),
                              fast_1_share=sum(counts_as_faster(c.speedup, 1.0, within_noise=c.id in full
                                                                and within_noise(full[c.id])) for c in correct)
                              / len(own)))
    return Training(steps=lines, logged=snap.train_steps(run_id))


def task_view(snap: Snapshot, run_id: int, task: str) -> TaskView:
    run = _get_run(snap, run_id)
    known = snap.tasks()
    rows = snap.candidates(run_id, task)
    if task not in known and not rows:
        raise NotFound(f"no task {task!r} in run {run_id}")
    details = [d for d in (snap.candidate(c.id) for c in rows) if d is not None]
    parent_ids = sorted({p for d in details for p in d.parents[:1]})
    line = _task_lines(snap, run_id, [task], rows, known)[0]
    own = known.get(task)
    return TaskView(run=summary(run, snap.count_candidates(run_id)), task=task,
                    level=own.level if own else None, reference=own.source if own else "", line=line,
                    candidates=details, parents=snap.sources(parent_ids),
                    hack_cases=snap.hack_cases(run_id, task))


def candidate_view(snap: Snapshot, candidate_id: int) -> tuple[CandidateDetail, str, str | None]:
    """(candidate, its task's reference source, its first parent's source)."""
    d = snap.candidate(candidate_id)
    if d is None:
        raise NotFound(f"no candidate {candidate_id} in this database")
    known = snap.tasks()
    parent = snap.sources(list(d.parents[:1])).get(d.parents[0]) if d.parents else None
    return d, known[d.task].source if d.task in known else "", parent
