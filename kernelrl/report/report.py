"""Reports on a code database: how much faster the search made each task, and how honestly.

`build_report(db_path)` computes a typed `Report`; `render_report` prints it as rich tables and
`write_html` writes one self-contained HTML file (tables plus matplotlib plots embedded as base64
PNGs). Computing and rendering are separate so the numbers can be tested and reused.

Definitions (per task, its *best* candidate is its fastest correct one):
- speedup against eager = the evaluator's speedup (reference median / candidate median, both
  measured in the same evaluation);
- speedup against torch.compile = speedup against eager x compile_ms / eager_ms of the task's
  stored baseline (the same device and size); tasks without a compile baseline have none;
- fast_p = fraction of all tasks whose best candidate counts as more than p times faster than
  eager (`kernelrl.report.metrics.counts_as_faster`: above p and, for p >= 1, not within noise);
  fast_0 is the fraction of tasks with any correct candidate; every "faster" count (by turn, the
  plots' titles) uses the same function;
- geomean and median speedups are over the tasks that have a best candidate (the count is shown);
  the geomean's range is the geomean of the best candidates' 95 % interval ends (a task without
  an interval counts at its speedup): how far the headline moves within the tasks' own
  measurement noise, not a confidence interval over tasks;
- success rate = correct / evaluated candidates; refused counts = candidates flagged, per
  rejecting rule.

- % of roofline: the best candidate's share of this machine's roofline (its floor / its time),
  as the evaluator measured it.

Does not re-check any number: it reads what the evaluator stored.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from kernelrl.report.metrics import counts_as_faster, fast_p, geometric_mean
from kernelrl.result import Severity, Status
from kernelrl.reward import within_noise
from kernelrl.store import Database
from kernelrl.store.records import CandidateRecord

FAST_P = (0.0, 1.0, 1.5, 2.0)


@dataclass(frozen=True, kw_only=True)
class TaskReport:
    task: str
    level: int | None
    candidates: int
    evaluated: int
    correct: int
    best_candidate: int | None  # id of the fastest correct candidate
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    eager_ms: float | None  # stored baseline
    compile_ms: float | None
    best_so_far: tuple[float | None, ...]  # after each evaluated candidate, in order; None: none correct yet
    roofline_pct: float | None = None  # the best candidate's share of this machine's roofline, when measured
    ci_vs_eager: tuple[float, float] | None = None  # the best speedup's 95 % interval
    # the best speedup cannot be told from 1.0x (its interval, or the task's A/A band, holds it)
    within_noise: bool = False
    # eager / torch.compile could not be told apart when the baseline was measured (its interval holds 1.0)
    compile_within_noise: bool = False


@dataclass(frozen=True, kw_only=True)
class RunReport:
    id: int
    started: float  # seconds since the epoch
    status: str  # "running" also means killed and not resumed
    proposer: str
    candidates: int


@dataclass(frozen=True, kw_only=True)
class TurnReport:
    """What the candidates of one turn of refinement episodes did (multi-turn runs)."""

    turn: int
    candidates: int
    evaluated: int
    correct: int
    faster: int  # correct and faster than eager (`counts_as_faster`: within noise does not count)
    best_speedup: float | None
    raised: int  # times a candidate of this turn raised its task's best so far (in the order judged)


@dataclass(frozen=True, kw_only=True)
class Report:
    db_path: str
    run_id: int | None  # None: every run in the file
    tasks: tuple[TaskReport, ...]
    fast_p: tuple[tuple[float, float], ...]  # (p, fraction of tasks)
    geomean_vs_eager: float | None
    median_vs_eager: float | None
    # the geomean of the best candidates' interval ends (see the module docstring); None: nothing solved
    geomean_range_vs_eager: tuple[float, float] | None
    geomean_vs_compile: float | None
    median_vs_compile: float | None
    solved: int  # tasks with a correct candidate
    # tasks whose best counts as faster than eager (`counts_as_faster`), and solved tasks whose best
    # is above 1.0x but within noise (shown apart, never counted as faster)
    faster: int = 0
    noisy_above_one: int = 0
    with_compile: int  # solved tasks with a compile baseline
    candidates: int
    evaluated: int
    correct: int
    success_rate: float | None  # correct / evaluated
    status_counts: tuple[tuple[str, int], ...]  # status value (or "proposed") -> candidates
    refused_by_rule: tuple[tuple[str, int], ...]  # rule -> flagged candidates, most frequent first
    runs: tuple[RunReport, ...] = ()
    by_turn: tuple[TurnReport, ...] = ()  # refinement turns, when any candidate was a turn of an episode

    def fast(self, p: float) -> float:
        for q, value in self.fast_p:
            if q == p:
                return value
        raise KeyError(f"fast_p not computed for p={p}")


def build_report(db_path: str | Path, *, run_id: int | None = None) -> Report:
    """Compute the report over every run in the file, or over one run."""
    with Database(db_path, readonly=True) as db:
        cands = db.candidates(run_id=run_id)
        known = {t.name: t for t in db.tasks()}
        baselines = {(b.task, b.device, b.size): b for b in db.baselines()}
        flagged_rules = _refused_by_rule(cands)
        runs = tuple(RunReport(id=r.id, started=r.started, status=r.status.value,
                               proposer=str(r.config.get("proposer", "")),
                               candidates=db.count_candidates(run_id=r.id))
                     for r in db.runs() if run_id is None or r.id == run_id)
        run = db.get_run(run_id) if run_id is not None else None
    if run_id is not None and run is None:
        raise ValueError(f"no run {run_id} in {db_path}")
    # a run's tasks include those that got no candidate at all (they count against fast_p)
    in_scope = set(run.config.get("task_names", [])) if run is not None else set(known)
    names = sorted({c.task for c in cands} | in_scope)
    by_task: dict[str, list[CandidateRecord]] = {n: [] for n in names}
    for c in cands:
        by_task[c.task].append(c)

    rows: list[TaskReport] = []
    for name in names:
        own = by_task[name]
        evaluated = [c for c in own if c.result is not None]
        correct = [c for c in evaluated if c.is_correct and c.speedup is not None]
        best = max(correct, key=lambda c: (c.speedup, -c.id)) if correct else None
        curve: list[float | None] = []
        running: float | None = None
        for c in evaluated:
            if c.is_correct and c.speedup is not None:
                running = c.speedup if running is None else max(running, c.speedup)
            curve.append(running)
        eager_ms = compile_ms = vs_compile = None
        compile_noisy = False
        if best is not None and best.result is not None:
            b = baselines.get((name, best.result.device, best.result.size))
            if b is not None:
                eager_ms, compile_ms = b.eager_ms, b.compile_ms
                compile_noisy = b.compile_within_noise
                if compile_ms is not None and best.speedup is not None:
                    vs_compile = best.speedup * compile_ms / eager_ms
        task_rec = known.get(name)
        rows.append(TaskReport(task=name, level=task_rec.level if task_rec else None, candidates=len(own),
                               evaluated=len(evaluated), correct=len(correct),
                               best_candidate=best.id if best else None,
                               speedup_vs_eager=best.speedup if best else None, speedup_vs_compile=vs_compile,
                               eager_ms=eager_ms, compile_ms=compile_ms, best_so_far=tuple(curve),
                               roofline_pct=best.result.roofline_pct if best and best.result else None,
                               ci_vs_eager=best.result.speedup_ci if best and best.result else None,
                               within_noise=bool(best and best.result and within_noise(best.result)),
                               compile_within_noise=compile_noisy))

    eager = [r.speedup_vs_eager for r in rows if r.speedup_vs_eager is not None]
    comp = [r.speedup_vs_compile for r in rows if r.speedup_vs_compile is not None]
    fast = tuple((p, fast_p([r.speedup_vs_eager for r in rows], p, within_noise=[r.within_noise for r in rows]))
                 for p in FAST_P)
    evaluated_n = sum(r.evaluated for r in rows)
    correct_n = sum(r.correct for r in rows)
    statuses = Counter(c.result.status.value if c.result else "proposed" for c in cands)
    order = [s.value for s in Status] + ["proposed"]
    lows = [r.ci_vs_eager[0] if r.ci_vs_eager else r.speedup_vs_eager for r in rows if r.speedup_vs_eager is not None]
    highs = [r.ci_vs_eager[1] if r.ci_vs_eager else r.speedup_vs_eager for r in rows if r.speedup_vs_eager is not None]
    low, high = geometric_mean([v for v in lows if v is not None and v > 0]), geometric_mean(
        [v for v in highs if v is not None and v > 0])
    return Report(db_path=str(db_path), run_id=run_id, tasks=tuple(rows), fast_p=fast,
                  geomean_vs_eager=geometric_mean(eager),
                  geomean_range_vs_eager=(low, high) if low is not None and high is not None else None,
                  median_vs_eager=statistics.median(eager) if eager else None,
                  geomean_vs_compile=geometric_mean(comp), median_vs_compile=statistics.median(comp) if comp else None,
                  solved=len(eager), with_compile=len(comp),
                  faster=sum(counts_as_faster(r.speedup_vs_eager, 1.0, within_noise=r.within_noise) for r in rows),
                  noisy_above_one=sum(1 for r in rows
                                      if r.within_noise and (r.speedup_vs_eager or 0.0) > 1.0),
                  candidates=len(cands), evaluated=evaluated_n,
                  correct=correct_n, success_rate=(correct_n / evaluated_n) if evaluated_n else None,
                  status_counts=tuple((s, statuses[s]) for s in order if statuses[s]),
                  refused_by_rule=tuple(flagged_rules.most_common()), runs=runs, by_turn=by_turn(cands))


def by_turn(cands: list[CandidateRecord]) -> tuple[TurnReport, ...]:
    """Per refinement turn: candidates, verdicts, the best speedup, and how often a turn raised its
    task's best so far (what each turn added); () when no candidate was a turn of an episode."""
    turns = {c.id: c.meta.turn for c in cands if c.meta.turn is not None}
    if not turns:
        return ()
    best: dict[str, float] = {}
    raised: Counter[int] = Counter()
    for c in sorted(cands, key=lambda c: c.id):
        if c.is_correct and c.speedup is not None and c.speedup > best.get(c.task, 0.0):
            best[c.task] = c.speedup
            if c.id in turns:
                raised[turns[c.id]] += 1
    out = []
    for t in sorted(set(turns.values())):
        own = [c for c in cands if turns.get(c.id) == t]
        correct = [c for c in own if c.is_correct and c.speedup is not None]
        faster = sum(counts_as_faster(c.speedup, 1.0, within_noise=c.result is not None and within_noise(c.result))
                     for c in correct)
        out.append(TurnReport(turn=t, candidates=len(own), evaluated=sum(c.result is not None for c in own),
                              correct=len(correct), faster=faster,
                              best_speedup=max((c.speedup or 0.0 for c in correct), default=None),
                              raised=raised[t]))
    return tuple(out)


def _refused_by_rule(cands: list[CandidateRecord]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for c in cands:
        if c.result is not None and c.result.status is Status.FLAGGED:
            for rule in {f.rule for f in c.result.findings if f.severity is Severity.REJECT}:
                counts[rule] += 1
    return counts
