"""The bench with refinement turns: what T turns of one sample add, and whether they beat T samples.

`run_turn_bench(config)` (`BenchConfig.episode.turns` = T > 1) runs, for every task of the split, `k`
independent episodes (`kernelrl.episodes.episode`) of T turns each: turn 1 is the same
first-attempt prompt the single-turn bench uses (`build_prompt` with no database); turn t's is
that prompt with the episode's earlier answers and their verdicts as a model should read them
(`kernelrl.episodes.feedback`: compiler errors, the first mismatch, speedups against eager and,
when measured, torch.compile), within `history_tokens`. Each turn, every live episode's answer
is asked for, and all of them are judged in one evaluator batch. Every episode runs its T turns
(a correct answer is refined further, as Kevin does).

A sample's result at turn t is the **best of its first t turns** (the correct answer with the
highest speedup, else its latest verdict): Kevin's "best so far", so a later turn that breaks a
correct kernel does not undo it. On those results, per turn, the single-turn bench's numbers
(`kernelrl.train.bench.summarise`: pass@j and fast_p@j for j = 1..k, best speedups and their
geometric means); besides, the share of answers that are correct at turn t itself (a turn that
regresses shows there).

The equal-budget comparison (Kevin: serial refinement against parallel sampling), for each
budget of t model calls per task: one sample refined for t turns (pass@1 and fast_p@1 of the
best of its first t turns) against t independent single-turn samples (pass@t and fast_p@t of
the turn-1 answers, which are k independent draws of the same first-attempt prompt; defined
for t <= k, so ask k >= T for the whole table).

A finite proposer (a replay file) hands out a task's rows in the order asked: turn by turn, the
k samples' answers for turn 1, then for turn 2, and so on. A sample whose proposer runs out
ends there: its best so far stays what it had; a sample with no answer at all counts as a
failure, as in the single-turn bench.

Guarantees: every verdict comes from the evaluator; with `db_path`, every turn's answer and
verdict is stored (proposer `bench:<spec>`, meta `stage`, `sample` and `turn`, each turn's
parent the sample's previous turn); the single-turn bench (`run_bench`) is unchanged.

Does not train or change the model.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kernelrl.episodes.driver import Judgement, run_episodes
from kernelrl.episodes.episode import Episode
from kernelrl.result import Status
from kernelrl.store.records import RunMeta, RunStage
from kernelrl.tasks.splits import SplitError, select
from kernelrl.tasks.task import Task
from kernelrl.train.bench import BenchConfig, BenchReport, _compile_speedups, bench_record, saying, summarise
from kernelrl.train.rollouts import (
    EvalSettings,
    Judged,
    Rollout,
    evaluate_rollouts,
    store_rollouts,
    task_profiles,
)

if TYPE_CHECKING:
    from rich.console import Console

    from kernelrl.judge.contract import ProfilingJudge
    from kernelrl.judge.harness.profile import TaskProfile
    from kernelrl.proposers import Proposer


@dataclass(frozen=True, kw_only=True)
class EqualBudget:
    """t model calls per task, spent serially (one sample, t turns) or in parallel (t samples, one turn)."""

    calls: int
    serial_pass: float  # pass@1 of the best of each sample's first `calls` turns
    parallel_pass: float | None  # pass@calls of the turn-1 answers; None when k < calls
    serial_fast: dict[float, float]  # p -> fast_p@1 after `calls` turns
    parallel_fast: dict[float, float | None]  # p -> fast_p@calls of the turn-1 answers


@dataclass(frozen=True, kw_only=True)
class TurnBenchReport:
    proposer: str
    k: int
    turns: int
    ps: tuple[float, ...]
    by_turn: tuple[BenchReport, ...]  # [t - 1]: every sample's best of its first t turns
    correct_at_turn: tuple[float, ...]  # [t - 1]: mean over tasks of the share of samples correct at turn t itself
    budget: tuple[EqualBudget, ...]  # [t - 1]: t model calls per task

    def to_dict(self) -> dict[str, object]:  # for json.dumps
        return {"proposer": self.proposer, "k": self.k, "turns": self.turns, "result_at_turn": "best so far",
                "by_turn": [{"turn": t, "correct_at_turn": c, **r.to_dict()}
                            for t, (r, c) in enumerate(zip(self.by_turn, self.correct_at_turn), 1)],
                "equal_budget": [{"calls": b.calls, "serial_pass": b.serial_pass, "parallel_pass": b.parallel_pass,
                                  "serial_fast": {str(p): v for p, v in b.serial_fast.items()},
                                  "parallel_fast": {str(p): v for p, v in b.parallel_fast.items()}}
                                 for b in self.budget]}


def run_turn_bench(config: BenchConfig, *, proposer: Proposer | None = None, backend: ProfilingJudge | None = None,
                   tasks: Sequence[Task] | None = None, console: Console | None = None) -> TurnBenchReport:
    """Episodes, judged turn by turn, summarised by turn (see the module docstring); `proposer`
    and `backend` replace the configured ones (tests)."""
    from kernelrl.run_parts import build_run
    from kernelrl.tasks.suites import load_tasks

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
        # Measured first, so every verdict after turn 1 can compare with torch.compile.
        compile_speedups = _compile_speedups(backend, tasks, config, run.reporter) if config.compile_baseline else {}
        samples = _Episodes(config, tasks, task_profiles(backend, tasks), compile_speedups)

        def judge(turn: int, asked: Sequence[int], prompts: Sequence[str], answers: Sequence[str]) -> list[Judgement]:
            rollouts = samples.rollouts(asked, prompts, answers)
            with saying(run.reporter, f"bench: turn {turn} of {config.episode.turns}: judging {len(rollouts)} answers "
                                 f"from {config.proposer}", backend):
                judged = evaluate_rollouts(backend, rollouts, {t.name: t for t in tasks}, db=db, reuse=settings)
            if db is not None:
                judged = store_rollouts(db, judged, proposer=f"bench:{config.proposer}", settings=settings,
                                        run_id=run_id, meta=[RunMeta(stage=RunStage.BENCH,
                                                                     sample=samples.keys[i][1], turn=turn)
                                                             for i in asked])
            return samples.record(asked, judged)

        run_episodes(samples.episodes, samples.bases,
                     ask=lambda turn, live, prompts: samples.ask(proposer, live, prompts), judge=judge)
    return summarise_turns(config, tasks, samples.judged, compile_speedups)


def summarise_turns(config: BenchConfig, tasks: Sequence[Task], judged: dict[tuple[str, int], list[Judged]],
                    compile_speedups: dict[str, float | None]) -> TurnBenchReport:
    """The by-turn reports and the equal-budget comparison from each sample's judged turns
    (`judged[(task, sample)]`: turn 1 first)."""
    by_turn: list[BenchReport] = []
    correct_at: list[float] = []
    for t in range(1, config.episode.turns + 1):
        per_task = {task.name: [best_so_far(judged[(task.name, i)][:t]) for i in range(config.k)
                                if judged.get((task.name, i))] for task in tasks}
        by_turn.append(summarise(config, tasks, per_task, compile_speedups))
        correct_at.append(statistics.fmean(
            sum(1 for i in range(config.k) if len(judged.get((task.name, i), [])) >= t
                and judged[(task.name, i)][t - 1].status is Status.CORRECT) / config.k for task in tasks))
    first = by_turn[0]
    budget = tuple(EqualBudget(
        calls=t, serial_pass=by_turn[t - 1].pass_at[1], parallel_pass=first.pass_at.get(t),
        serial_fast={p: by_turn[t - 1].fast_at[p][1] for p in config.ps},
        parallel_fast={p: first.fast_at[p].get(t) for p in config.ps}) for t in range(1, config.episode.turns + 1))
    return TurnBenchReport(proposer=config.proposer, k=config.k, turns=config.episode.turns, ps=config.ps,
                           by_turn=tuple(by_turn), correct_at_turn=tuple(correct_at), budget=budget)


def best_so_far(turns: Sequence[Judged]) -> Judged:
    """The best of a sample's turns: the correct one with the highest speedup (a timed one before
    an untimed one; the latest of equals), else the latest turn."""
    correct = [j for j in turns if j.status is Status.CORRECT]
    if not correct:
        return turns[-1]
    return max(reversed(correct), key=lambda j: (j.result is not None and j.result.speedup is not None,
                                                 (j.result.speedup if j.result is not None else None) or 0.0))


class _Episodes:
    """The k episodes of every task (in (task, sample) order), their prompts and judged turns;
    what the driver's `ask` and `judge` call."""

    def __init__(self, config: BenchConfig, tasks: Sequence[Task], profiles: dict[str, TaskProfile | None],
                 compile_speedups: dict[str, float | None]) -> None:
        from kernelrl.episodes.prompt import build_prompt

        self.config = config
        self.tasks = {t.name: t for t in tasks}
        self.profiles = profiles
        self.compile_speedups = compile_speedups
        settings = EvalSettings.of(config.eval)
        self.base = {t.name: build_prompt(t, db=None, chain_best=None, policy=settings.policy, device=settings.device,
                                          rng=random.Random(config.seed), size=settings.size,
                                          profile=profiles.get(t.name), template_dir=config.template_dir)
                     for t in tasks}
        self.keys = [(t.name, i) for t in tasks for i in range(config.k)]  # episode index -> (task, sample)
        self.episodes = [Episode(task=name, config=config.episode, template_dir=config.template_dir)
                         for name, _ in self.keys]
        self.bases = [self.base[name] for name, _ in self.keys]
        self.tokens = [(0, 0)] * len(self.keys)  # the latest answer's prompt and completion tokens
        self.judged: dict[tuple[str, int], list[Judged]] = {key: [] for key in self.keys}

    def ask(self, proposer: Proposer, live: Sequence[int], prompts: Sequence[str]) -> list[str | None]:
        """The answers of episodes `live` to their prompts (None: the proposer has no more for it)."""
        from kernelrl.proposers import Exhausted, ProposalRequest

        def one(i: int, prompt: str) -> str | None:
            name, sample = self.keys[i]
            episode = self.episodes[i]
            try:
                out = proposer.propose(ProposalRequest(task=self.tasks[name], prompt=prompt,
                                                       parent=episode.turns[-1].code if episode.turns else None,
                                                       chain=sample, step=episode.turn - 1,
                                                       profile=self.profiles.get(name)))
            except Exhausted:
                return None
            self.tokens[i] = (int(out.prompt_tokens), int(out.completion_tokens))
            return str(out.answer)

        with ThreadPoolExecutor(max_workers=self.config.model_concurrency) as ex:
            return list(ex.map(one, live, prompts))

    def rollouts(self, asked: Sequence[int], prompts: Sequence[str], answers: Sequence[str]) -> list[Rollout]:
        """The answers to judge, each with its prompt, tokens and parent (the sample's previous turn)."""
        return [Rollout(task=self.keys[i][0], prompt=p, answer=a, prompt_tokens=self.tokens[i][0],
                        completion_tokens=self.tokens[i][1], parents=self.episodes[i].parents)
                for i, p, a in zip(asked, prompts, answers)]

    def record(self, asked: Sequence[int], judged: Sequence[Judged]) -> list[Judgement]:
        """Each judged answer kept for the report, and its verdict for the driver."""
        out: list[Judgement] = []
        for i, j in zip(asked, judged, strict=True):
            self.judged[self.keys[i]].append(j)
            out.append(Judgement(code=j.code, result=j.result, candidate_id=j.candidate_id,
                                 compile_speedup=self.compile_speedups.get(self.keys[i][0])))
        return out


def plot_turn_bench(report: TurnBenchReport, path: str | Path) -> Path:
    """pass@1 and fast_p@1 by turn (best so far), and the equal-budget comparison, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    turns = list(range(1, report.turns + 1))
    left.plot(turns, [r.pass_at[1] for r in report.by_turn], marker="o", label="pass@1 (best so far)")
    for p in report.ps:
        left.plot(turns, [r.fast_at[p][1] for r in report.by_turn], marker=".", label=f"fast_{p:g}@1 (best so far)")
    left.plot(turns, list(report.correct_at_turn), linestyle="--", color="grey", label="correct at this turn")
    left.set_xlabel("turn")
    left.set_ylabel("share of tasks")
    left.set_ylim(-0.02, 1.02)
    left.set_xticks(turns)
    left.legend(fontsize=8)
    left.set_title(f"{report.proposer}: {len(report.by_turn[0].tasks)} tasks, k = {report.k}")
    calls = [b.calls for b in report.budget]
    right.plot(calls, [b.serial_pass for b in report.budget], marker="o", label="1 sample, t turns: pass@1")
    right.plot(calls, [b.parallel_pass if b.parallel_pass is not None else float("nan") for b in report.budget],
               marker="s", label="t samples, 1 turn: pass@t")
    for p in report.ps:
        right.plot(calls, [b.serial_fast[p] for b in report.budget], linestyle=":", marker="o",
                   label=f"1 sample, t turns: fast_{p:g}@1")
        right.plot(calls, [v if (v := b.parallel_fast[p]) is not None else float("nan") for b in report.budget],
                   linestyle=":", marker="s", label=f"t samples, 1 turn: fast_{p:g}@t")
    right.set_xlabel("model calls per task (t)")
    right.set_ylabel("share of tasks")
    right.set_ylim(-0.02, 1.02)
    right.set_xticks(calls)
    right.legend(fontsize=8)
    right.set_title("equal budget: serial refinement vs parallel samples")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
