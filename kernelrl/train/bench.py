"""Evaluation of a model (or any proposer) on a suite: the numbers a paper prints.

`run_bench(config)` takes the tasks of the configured split (`kernelrl.tasks.splits`: test by
default, so a trained model is measured on tasks it never trained on; `split = "all"` takes
every task given), asks the proposer for `k` answers per task, every task with the same
first-attempt prompt (no earlier versions: `build_prompt` with no database), judges all of them
in one evaluator batch, and reports, over the tasks:

- pass@j and fast_p@j for j = 1..k (unbiased estimator, `kernelrl.report.metrics`): the chance
  that j samples hold a correct one, or a correct one faster than p times the reference (a
  sample within noise never counts as faster: `counts_as_faster`, as in every report);
- per task the best correct speedup against eager and, when the torch.compile baseline is
  measured, against torch.compile; their geometric mean and median over the tasks solved, and
  the geometric mean over all tasks with an unsolved task counted as 1.0x (the reference kept);
- the verdicts by status.

A finite proposer (a replay file) may have fewer than k answers for a task; the missing samples
count as failures (never as successes), and the report says how many were missing.

`plot_bench` draws pass@j and fast_p@j against j, and the per-task best speedups.

With `turns` > 1 the samples are refinement episodes: `kernelrl.train.bench_turns.run_turn_bench`
runs them and reports these numbers by turn; `run_bench` is the single-turn bench only.

Guarantees: every sample's verdict comes from the evaluator; with `db_path`, every sample and
its verdict is stored (proposer `bench:<spec>`) under a run of stage `bench` (`bench_record`,
opened and closed by the run's builder: `finished`, `interrupted` or `failed`, so the run page,
`--watch.port`, shows it), and a source already judged under the same settings is not judged again.

Does not train or change the model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelrl.episodes.episode import EpisodeConfig
from kernelrl.judge.eval_config import EvalConfig
from kernelrl.judge.timing.throughput import Throughput
from kernelrl.report.metrics import fast_p_at_k, geometric_mean, pass_at_k
from kernelrl.result import Status
from kernelrl.reward import within_noise
from kernelrl.store.records import RunMeta, RunStage
from kernelrl.tasks.splits import Split, SplitError, select
from kernelrl.tasks.task import Task
from kernelrl.train.rollouts import (
    EvalSettings,
    Rollout,
    evaluate_rollouts,
    store_rollouts,
    task_profiles,
)
from kernelrl.web.config import WatchConfig

if TYPE_CHECKING:
    from rich.console import Console

    from kernelrl.judge.contract import ProfilingJudge
    from kernelrl.judge.harness.profile import TaskProfile
    from kernelrl.proposers import Proposal, Proposer
    from kernelrl.run_parts import Reporter
    from kernelrl.train.rollouts import Judged


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    tasks: tuple[str, ...]
    proposer: str
    split: str = "test"  # the split evaluated (kernelrl.tasks.splits); "all": every task given
    proposer_opts: dict[str, Any] = field(default_factory=dict)
    k: int = 5  # samples per task; pass@1..k
    ps: tuple[float, ...] = (1.0, 1.5, 2.0)  # fast_p thresholds (speedup over eager)
    compile_baseline: bool = True  # also measure each task's torch.compile time (slow on a CPU)
    db_path: Path | None = None
    model_concurrency: int = 4
    seed: int = 0
    template_dir: Path | None = None
    # turns per sample (refinement episodes: kernelrl.train.bench_turns; 1: single-turn) and the most
    # the earlier turns may take of a prompt (characters / 4)
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    watch: WatchConfig = field(default_factory=WatchConfig)  # the run page served while the run goes: watch.port

    def __post_init__(self) -> None:
        object.__setattr__(self, "ps", tuple(float(p) for p in self.ps))
        if self.db_path is not None:
            object.__setattr__(self, "db_path", Path(self.db_path))
        if not self.tasks:
            raise ValueError("no tasks given")
        if self.k < 1 or self.model_concurrency < 1:
            raise ValueError("k and model_concurrency must be >= 1")
        if any(p < 0 for p in self.ps):
            raise ValueError("fast_p thresholds must be >= 0")
        if self.split != "all":
            Split(self.split)  # a ValueError naming it otherwise
        if self.watch.port is not None and self.db_path is None:
            raise ValueError("watch.port: a run page shows the run's database, and this bench keeps none (name one)")


@dataclass(frozen=True, kw_only=True)
class TaskBench:
    task: str
    level: int | None
    samples: int  # answers the proposer gave (at most k)
    correct: int
    speedups: tuple[float | None, ...]  # per sample (k entries: missing ones are None)
    within_noise: tuple[bool, ...]  # per sample: its speedup cannot be told from 1.0x (k entries)
    best_speedup: float | None  # best correct speedup against eager
    compile_speedup: float | None  # the task's eager / torch.compile ratio, when measured
    statuses: dict[str, int]

    @property
    def best_vs_compile(self) -> float | None:
        if self.best_speedup is None or not self.compile_speedup:
            return None
        return self.best_speedup / self.compile_speedup


@dataclass(frozen=True, kw_only=True)
class BenchReport:
    proposer: str
    k: int
    ps: tuple[float, ...]
    tasks: tuple[TaskBench, ...]
    pass_at: dict[int, float]  # j -> mean pass@j over tasks
    fast_at: dict[float, dict[int, float]]  # p -> j -> mean fast_p@j
    geomean_eager: float | None  # over solved tasks
    median_eager: float | None
    geomean_eager_all: float | None  # unsolved tasks as 1.0x
    geomean_compile: float | None  # over solved tasks with a compile baseline
    median_compile: float | None
    missing_samples: int
    statuses: dict[str, int]
    run_id: int | None = None  # the bench's run in its database (each sample a candidate of it), if kept
    # the programs judged in this bench (not reused), per hour of the judging, and where it went
    throughput: Throughput | None = None

    @property
    def solved(self) -> int:
        return sum(1 for t in self.tasks if t.best_speedup is not None)

    def to_dict(self) -> dict[str, object]:  # for json.dumps
        return {"proposer": self.proposer, "k": self.k, "tasks": len(self.tasks), "solved": self.solved,
                "pass_at": {str(j): v for j, v in self.pass_at.items()},
                "fast_at": {str(p): {str(j): v for j, v in by_j.items()} for p, by_j in self.fast_at.items()},
                "geomean_eager": self.geomean_eager, "median_eager": self.median_eager,
                "geomean_eager_all": self.geomean_eager_all, "geomean_compile": self.geomean_compile,
                "median_compile": self.median_compile, "missing_samples": self.missing_samples,
                "statuses": dict(self.statuses), "run_id": self.run_id,
                "throughput": self.throughput.to_dict() if self.throughput is not None else None,
                "per_task": [{"task": t.task, "level": t.level, "samples": t.samples, "correct": t.correct,
                              "best_speedup": t.best_speedup, "compile_speedup": t.compile_speedup,
                              "best_vs_compile": t.best_vs_compile, "statuses": t.statuses} for t in self.tasks]}


def run_bench(config: BenchConfig, *, proposer: Proposer | None = None, backend: ProfilingJudge | None = None,
              tasks: Sequence[Task] | None = None, console: Console | None = None) -> BenchReport:
    """Sample, judge and summarise (see the module docstring); `proposer` and `backend` replace the
    configured ones (tests)."""
    from kernelrl.run_parts import build_run
    from kernelrl.tasks.suites import load_tasks

    if config.episode.turns != 1:
        raise ValueError("run_bench is the single-turn bench; kernelrl.train.bench_turns.run_turn_bench runs turns > 1")
    tasks = list(tasks) if tasks is not None else load_tasks(list(config.tasks))
    if config.split != "all":
        tasks, _ = select(tasks, [config.split])
        if not tasks:
            raise SplitError(f"no task of the {config.split} split among {', '.join(config.tasks)} "
                             "(--split all takes every task given)")
    settings = EvalSettings.of(config.eval)
    with build_run(tasks=tasks, eval_config=config.eval, db_path=config.db_path, judge=backend,
                   proposers={config.proposer: proposer} if proposer is not None else None, console=console,
                   watch=config.watch, record=bench_record(config, tasks)) as run:
        proposer = run.proposer(config.proposer, **config.proposer_opts)
        backend, db, run_id = run.judge, run.db, run.run_id
        with saying(run.reporter, f"bench: reading {len(tasks)} task references in workers", backend):
            profiles = task_profiles(backend, tasks)
        with saying(run.reporter, f"bench: asking {config.proposer} for {config.k} answers to each of {len(tasks)} "
                             "tasks", None):
            rollouts = _sample(proposer, tasks, config, settings, profiles)
        with saying(run.reporter, f"bench: judging {len(rollouts)} answers from {config.proposer}", backend):
            clock = time.monotonic()
            judged = evaluate_rollouts(backend, rollouts, {t.name: t for t in tasks}, db=db, reuse=settings)
            throughput = Throughput.of([j.result for j in judged if j.judged_here and j.result is not None],
                                       time.monotonic() - clock)
        if db is not None:
            store_rollouts(db, judged, proposer=f"bench:{config.proposer}", settings=settings, run_id=run_id,
                           meta=[RunMeta(stage=RunStage.BENCH)] * len(judged))
        compile_speedups = _compile_speedups(backend, tasks, config, run.reporter) if config.compile_baseline else {}
    per_task: dict[str, list[Judged]] = {t.name: [] for t in tasks}
    for j in judged:
        per_task[j.rollout.task].append(j)
    return dataclasses.replace(summarise(config, tasks, per_task, compile_speedups), run_id=run_id,
                               throughput=throughput)


def bench_record(config: BenchConfig, tasks: Sequence[Task]) -> dict[str, object] | None:
    """What a bench stores as its run (stage `bench`, its tasks and settings; of the proposer's
    options only their names, which may hold a key), for the run's builder to open and close
    (`kernelrl.run_parts.build_run`); None without a database."""
    if config.db_path is None:
        return None
    from kernelrl.config import to_dict

    return {"stage": RunStage.BENCH.value, "proposer": f"bench:{config.proposer}",
            "config": {**to_dict(config), "proposer_opts": sorted(config.proposer_opts)},
            "task_names": [t.name for t in tasks]}


def summarise(config: BenchConfig, tasks: Sequence[Task], per_task: Mapping[str, Sequence[Judged]],
              compile_speedups: Mapping[str, float | None]) -> BenchReport:
    rows = []
    statuses: dict[str, int] = {}
    missing = 0
    for t in tasks:
        judged = list(per_task.get(t.name, ()))
        missing += config.k - len(judged)
        # (a CORRECT status always has its result: `Judged.status` reads it)
        speedups: list[float | None] = [j.result.speedup if j.status is Status.CORRECT and j.result is not None else None
                                        for j in judged]
        correct = sum(1 for j in judged if j.status is Status.CORRECT)
        # Correct but untimed samples count for pass@k; for fast_p they need a speed, and one within
        # noise never counts as faster (`counts_as_faster`).
        noisy = [j.result is not None and within_noise(j.result) for j in judged]
        speedups += [None] * (config.k - len(judged))
        noisy += [False] * (config.k - len(judged))
        own: dict[str, int] = {}
        for j in judged:
            key = (j.status or Status.NO_CODE).value
            own[key] = own.get(key, 0) + 1
            statuses[key] = statuses.get(key, 0) + 1
        timed = [s for s in speedups if s is not None]
        rows.append(TaskBench(task=t.name, level=t.level, samples=len(judged), correct=correct,
                              speedups=tuple(speedups), within_noise=tuple(noisy),
                              best_speedup=max(timed) if timed else None,
                              compile_speedup=compile_speedups.get(t.name), statuses=own))
    ks = range(1, config.k + 1)
    pass_at = {j: statistics.fmean(pass_at_k(config.k, r.correct, j) for r in rows) for j in ks}
    fast_at = {p: {j: statistics.fmean(fast_p_at_k(r.speedups, p, j, within_noise=r.within_noise) for r in rows)
                   for j in ks} for p in config.ps}
    solved = [r.best_speedup for r in rows if r.best_speedup is not None]
    vs_compile = [r.best_vs_compile for r in rows if r.best_vs_compile is not None]
    return BenchReport(proposer=config.proposer, k=config.k, ps=config.ps, tasks=tuple(rows), pass_at=pass_at,
                       fast_at=fast_at, geomean_eager=geometric_mean(solved),
                       median_eager=statistics.median(solved) if solved else None,
                       geomean_eager_all=geometric_mean([r.best_speedup or 1.0 for r in rows]),
                       geomean_compile=geometric_mean(vs_compile),
                       median_compile=statistics.median(vs_compile) if vs_compile else None,
                       missing_samples=missing, statuses=statuses)


def _sample(proposer: Proposer, tasks: Sequence[Task], config: BenchConfig, settings: EvalSettings,
            profiles: Mapping[str, TaskProfile | None]) -> list[Rollout]:
    from kernelrl.episodes.prompt import first_attempt_prompt
    from kernelrl.proposers import Exhausted, ProposalRequest

    prompts = {t.name: first_attempt_prompt(t, policy=settings.policy, device=settings.device, size=settings.size,
                                            profile=profiles.get(t.name), template_dir=config.template_dir)
               for t in tasks}
    jobs = [(t, i) for t in tasks for i in range(config.k)]

    def rollout(task: Task, out: Proposal) -> Rollout:
        return Rollout(task=task.name, prompt=prompts[task.name], answer=out.answer,
                       prompt_tokens=int(out.prompt_tokens), completion_tokens=int(out.completion_tokens))

    def one(job: tuple[Task, int]) -> Rollout | None:
        task, i = job
        try:
            return rollout(task, proposer.propose(ProposalRequest(task=task, prompt=prompts[task.name], step=i)))
        except Exhausted:
            return None

    def many(task: Task) -> list[Rollout]:
        try:
            outs = proposer.propose_many(ProposalRequest(task=task, prompt=prompts[task.name]), config.k)
        except Exhausted:
            return []
        return [rollout(task, out) for out in outs]

    if proposer.batched:  # a local model: a task's k samples in one batch
        return [r for t in tasks for r in many(t)]
    # A finite proposer hands out a task's rows in order: ask one task's samples in order.
    with ThreadPoolExecutor(max_workers=config.model_concurrency) as ex:
        outs = list(ex.map(one, jobs))
    return [r for r in outs if r is not None]


def _compile_speedups(backend: ProfilingJudge, tasks: Sequence[Task], config: BenchConfig,
                      reporter: Reporter) -> dict[str, float | None]:
    measure = getattr(backend, "baseline", None)
    out: dict[str, float | None] = {}
    if measure is None:
        return out
    for i, t in enumerate(tasks):
        try:
            with saying(reporter, f"bench: timing {t.name} eager and under torch.compile ({i + 1} of {len(tasks)})",
                        backend):
                out[t.name] = measure(t).compile_speedup
        except Exception as e:  # noqa: BLE001 - the report shows the task without a compile baseline
            out[t.name] = None
            reporter.say(f"[yellow]{t.name}: torch.compile baseline failed: {e}[/yellow]")
    return out


def saying(reporter: Reporter, what: str, backend: ProfilingJudge | None) -> contextlib.AbstractContextManager[None]:
    """A spinner saying `what` (and who holds the backend's timing lock) on the run's console, while
    the block runs (nothing on a quiet one: `waiting`)."""
    from kernelrl.search.activity import lock_watch, waiting

    return waiting(reporter.console, what, lock_watch(backend) if backend is not None else None)


def plot_bench(report: BenchReport, path: str | Path) -> Path:
    """pass@j and fast_p@j against j, and the best speedup per task, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    ks = sorted(report.pass_at)
    left.plot(ks, [report.pass_at[j] for j in ks], marker="o", label="pass@k")
    for p in report.ps:
        left.plot(ks, [report.fast_at[p][j] for j in ks], marker=".", label=f"fast_{p:g}@k")
    left.set_xlabel("k (samples per task)")
    left.set_ylabel("share of tasks")
    left.set_ylim(-0.02, 1.02)
    left.set_xticks(ks)
    left.legend()
    left.set_title(f"{report.proposer}: {len(report.tasks)} tasks")
    ordered = sorted(report.tasks, key=lambda t: t.best_speedup or 0.0)
    xs = range(len(ordered))
    right.bar(xs, [t.best_speedup or 0.0 for t in ordered], label="vs eager")
    compiled = [t.best_vs_compile for t in ordered]
    if any(v is not None for v in compiled):
        right.plot(xs, [v if v is not None else float("nan") for v in compiled], "k.", label="vs torch.compile")
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.set_xticks(list(xs), [t.task for t in ordered], rotation=60, ha="right", fontsize=7)
    right.set_ylabel("best correct speedup (0: none correct)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
